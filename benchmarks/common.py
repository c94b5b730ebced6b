"""What every `make bench` benchmark shares: repeated timing with medians, the machine's description,
and a result section that `benchmarks/run_all.py` writes into benchmarks/RESULTS.md.

A benchmark module defines `run(quick: bool) -> Section`. Figures are medians of repeated runs, and
every comparison is a ratio of two things measured in the same process, one after the other, so a
busy machine shifts both sides alike. Nothing here asserts a speed: targets are reported, not tested.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Target:
    """One figure against the issue's target: `ratio` <= `at_most` or >= `at_least`."""

    name: str
    ratio: float
    at_most: float | None = None
    at_least: float | None = None

    @property
    def met(self) -> bool:
        return (self.at_most is None or self.ratio <= self.at_most) and (
            self.at_least is None or self.ratio >= self.at_least
        )

    def goal(self) -> str:
        return f"<= {self.at_most}" if self.at_most is not None else f">= {self.at_least}"


@dataclass
class Section:
    """One benchmark's results: rows (dicts; consecutive rows with the same keys form a table), targets
    and notes."""

    title: str
    command: str
    rows: list[dict] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        out = [f"## {self.title}", "", f"`{self.command}`"]
        keys = None
        for r in self.rows:  # a row with other keys than the one before starts a new table
            if list(r) != keys:
                keys = list(r)
                out += ["", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            out.append("| " + " | ".join(_fmt(r[k]) for k in keys) + " |")
        out.append("")
        for t in self.targets:
            out.append(f"- **{t.name}: {t.ratio:.3g}** (target {t.goal()}: {'met' if t.met else 'NOT met'})")
        out += [f"- {n}" for n in self.notes]
        return "\n".join(out).rstrip() + "\n"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall-clock seconds of `fn()` over `repeats` calls, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine() -> str:
    """CPU model, cores, memory, and the torch build and threads the benchmarks ran with."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, Python {platform.python_version()}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads); load average "
        f"{os.getloadavg()[0]:.1f} (a load above the core count means other work shared the CPUs)"
    )


def write_section(readme: Path, title: str, text: str) -> None:
    """Replace the section of `readme` that starts with the line `title` (up to the next `## `), or append it."""
    import re

    old = readme.read_text()
    pattern = re.compile(re.escape(title) + r".*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)
    new = pattern.sub(lambda _: text + "\n", old, count=1) if pattern.search(old) else old.rstrip("\n") + "\n\n" + text
    readme.write_text(new.rstrip("\n") + "\n")
