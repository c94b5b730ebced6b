"""`teamrl sweep FILE` (train variants × seeds, resumable; `--status`: where each run is) and
`teamrl report FILE` (compare them from their records)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from flows.cli_common import USER_ERRORS, console, fail, flow_session, user_error


def sweep_cmd(
    file: Path = typer.Argument(..., help="a sweep file (YAML; experiments/*.yaml are examples)"),
    status: bool = typer.Option(False, "--status", help="show each run's state and stop"),
):
    """Train every variant of FILE on every seed, each as its own train flow run under one parent flow run;
    started again, it skips recorded runs and resumes interrupted ones."""
    from flows.sweep import status_rows
    from flows.sweep import sweep as sweep_flow
    from flows.sweep_spec import load_sweep

    try:
        spec = load_sweep(file)
        if status:
            _status_table(spec.name, status_rows(spec))
            return
        with flow_session():
            done = sweep_flow(spec=spec)
    except KeyboardInterrupt:
        fail(f"interrupted. Recorded runs are kept: `teamrl sweep {file}` resumes the rest", code=130)
    except USER_ERRORS as e:
        user_error(e)
    console.print(f"[green]sweep {spec.name} finished:[/] " + ", ".join(f"{k} {v}" for k, v in done.items()))
    _status_table(spec.name, status_rows(spec))
    console.print(f"compare them: teamrl report {file}")


def _status_table(name: str, rows: list[dict]) -> None:
    t = Table(title=f"sweep {name}")
    for c in ("variant", "seed", "run", "state", "iterations", "record"):
        t.add_column(c, overflow="fold")
    colour = {"recorded": "green", "running": "cyan", "interrupted": "yellow", "pending": "dim"}
    for r in rows:
        t.add_row(
            r["variant"],
            str(r["seed"]),
            r["run"],
            f"[{colour[r['state']]}]{r['state']}[/]",
            r["iterations"],
            r["record"] if r["state"] == "recorded" else "-",
        )
    console.print(t)


def report_cmd(
    file: Path = typer.Argument(..., help="the sweep file"),
    out: Path | None = typer.Option(
        None, "--out", help="folder for report.md, CSVs and plots (default: <records>/report)"
    ),
):
    """Compare the sweep's variants from its runs' records (nothing is run): report.md with the variants,
    the contrasts and their verdicts, CSV files and plots; also a Prefect artifact and, where the sweep ran
    here, files of its MLflow run."""
    from flows.sweep import report
    from flows.sweep_spec import load_sweep

    try:
        spec = load_sweep(file)
        with flow_session():
            files = report(spec, str(out or spec.records_dir() / "report"), str(file))
    except USER_ERRORS as e:
        user_error(e)
    console.print(f"[green]report:[/] {files[0]}")
    console.print(Path(files[0]).read_text(), markup=False, highlight=False, soft_wrap=True)
