"""`make bench`: every performance benchmark in turn, written to benchmarks/RESULTS.md.

    .venv/bin/python -m benchmarks.run_all [--quick] [--only store binpack ...]

With `--only`, an existing RESULTS.md keeps every other benchmark's section and only these are rewritten.

Each benchmark is a module `benchmarks/bench_<name>.py` with `run(quick) -> Section` (benchmarks/
common.py). They run one after the other in this process; one that fails is reported in its section
with the error, and the others still run. Run it on a quiet machine: the figures are medians and
ratios measured in the same run, but a busy machine still blurs them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.common import Section, machine, write_section

BENCHES = ["trl", "orchestration", "generation", "binpack", "store", "memory", "ranks", "coach_serving"]
OUT = Path(__file__).resolve().parent / "RESULTS.md"


def run_one(name: str, quick: bool) -> tuple[Section, float]:
    t0 = time.perf_counter()
    try:
        section = importlib.import_module(f"benchmarks.bench_{name}").run(quick=quick)
    except Exception as e:  # reported in RESULTS.md: one missing dependency must not hide the other figures
        section = Section(
            title=f"{name}: FAILED",
            command=f".venv/bin/python -m benchmarks.bench_{name}",
            notes=[f"`{type(e).__name__}: {e}`", "```\n" + traceback.format_exc(limit=3) + "```"],
        )
    return section, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes and one repeat (a smoke run)")
    ap.add_argument("--only", nargs="+", choices=BENCHES, default=BENCHES)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    command = f".venv/bin/python -m benchmarks.run_all{' --quick' if a.quick else ''}" + (
        f" --only {' '.join(a.only)}" if a.only != BENCHES else ""
    )
    parts, start = [], machine()
    for name in a.only:
        print(f"bench {name} ...", flush=True)
        load = os.getloadavg()[0]
        section, seconds = run_one(name, a.quick)
        print(section.markdown(), flush=True)
        when = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        stamp = f"_{seconds:.0f} s; measured {when} by `{command}`, load average {load:.1f} at its start_"
        parts.append((name, section.title, section.markdown() + f"\n{stamp}\n"))
    if a.only != BENCHES and a.out.exists():
        # a partial run replaces its own sections (and an earlier failure of the same benchmark), keeping the rest
        for name, title, text in parts:
            write_section(a.out, f"## {name}: FAILED", "")
            write_section(a.out, f"## {title}", text)
        print(f"updated {a.out}")
        return
    head = [
        "# Performance results (`make bench`)",
        "",
        f"Written by `{command}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; `--only` rewrites its own sections "
        "and keeps the others, so each section ends with when it was measured.",
        "",
        f"Machine at the start: {start}.",
        f"At the end: {machine()}.",
        "",
        "Figures are medians of repeated runs; each ratio compares two things measured in the same run. "
        "How each is measured: the module docstring of `benchmarks/bench_<name>.py`.",
        "",
    ]
    a.out.write_text("\n".join(head) + "\n" + "\n".join(text for _, _, text in parts))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
