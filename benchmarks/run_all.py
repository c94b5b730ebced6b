"""`make bench`: every performance benchmark in turn, written to benchmarks/RESULTS.md.

    .venv/bin/python -m benchmarks.run_all [--quick] [--only store binpack ...]

Each benchmark is a module `benchmarks/bench_<name>.py` with `run(quick) -> Section` (benchmarks/
common.py). They run one after the other in this process; one that fails is reported in its section
with the error, and the others still run. Run it on a quiet machine: the figures are medians and
ratios measured in the same run, but a busy machine still blurs them.
"""

from __future__ import annotations

import argparse
import importlib
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.common import Section, machine

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
    parts, start = [], machine()
    for name in a.only:
        print(f"bench {name} ...", flush=True)
        section, seconds = run_one(name, a.quick)
        print(section.markdown(), flush=True)
        parts.append(section.markdown() + f"\n_{seconds:.0f} s_\n")
    head = [
        "# Performance results (`make bench`)",
        "",
        f"Written by `.venv/bin/python -m benchmarks.run_all{' --quick' if a.quick else ''}"
        f"{' --only ' + ' '.join(a.only) if a.only != BENCHES else ''}` on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        "",
        f"Machine at the start: {start}.",
        f"At the end: {machine()}.",
        "",
        "Figures are medians of repeated runs; each ratio compares two things measured in the same run. "
        "How each is measured: the module docstring of `benchmarks/bench_<name>.py`.",
        "",
    ]
    a.out.write_text("\n".join(head) + "\n" + "\n".join(parts))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
