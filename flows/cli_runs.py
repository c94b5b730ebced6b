"""`teamrl runs list / show / export / trace`: what is in the runs folder, one run's table, disk use and
episodes, and its episodes as MLflow traces."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from flows.cli_common import USER_ERRORS, console, err, fail, show_table, user_error

runs_app = typer.Typer(help="Inspect runs.", no_args_is_help=True)


@runs_app.command("list")
def runs_list(runs_dir: str = typer.Option("runs", "--dir", help="folder holding the runs")):
    """List runs, oldest first."""
    from rich.markup import escape

    from infra import runs

    t = Table(title=f"runs in {runs_dir}")
    for column in ("run_id", "preset", "iterations", "seed"):
        t.add_column(column)
    damaged = []
    for rid in runs.list_runs(runs_dir):
        try:
            c = runs.read_run_config(Path(runs_dir) / rid)
        except runs.RunConfigError as e:  # listed, not fatal: one damaged run must not hide the others
            t.add_row(rid, "damaged", "-", "-")
            damaged.append(str(e))
            continue
        t.add_row(rid, str(c.get("preset")), str(c.get("iterations")), str(c.get("seed")))
    console.print(t)
    for msg in damaged:
        err.print(f"[yellow]warning:[/] {escape(msg)}", soft_wrap=True)


@runs_app.command("show")
def runs_show(
    run_id: str = typer.Argument(...),
    runs_dir: str = typer.Option("runs", "--dir"),
    episode: str | None = typer.Option(None, "--episode", "-e", help="print this episode as a transcript"),
    iteration: int | None = typer.Option(
        None, help="with --episode: its iteration (default: the latest holding the id; ids repeat across iterations)"
    ),
    phase: str | None = typer.Option(None, help="with --episode: its phase (rollout, eval, resample-<k>, ...)"),
    max_chars: int = typer.Option(1500, "--max-chars", help="with --episode: cut longer texts (0: never)"),
):
    """Per-iteration table of a run: success, coach score and loss per agent, and its disk use; with --episode,
    one episode turn by turn (responses, tool calls, coach scores and rationales, final answer)."""
    from flows.inspection import disk_summary
    from flows.report import run_table
    from infra import runs

    try:
        run_dir = runs.find_run(runs_dir, run_id)
    except USER_ERRORS as e:
        user_error(e)
    if episode is not None:
        from flows.inspection import transcript

        try:
            text = transcript(run_dir, episode, iteration, phase, max_chars=max_chars or None)
        except USER_ERRORS as e:
            user_error(e)
        console.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)
        _trace_hint(run_dir, runs_dir, episode, text)
        return
    show_table(run_table(run_dir), run_dir.name)
    console.print(disk_summary(run_dir), markup=False, highlight=False, soft_wrap=True)
    _episode_hint(run_id, runs_dir, run_dir)


def _trace_hint(run_dir: Path, runs_dir: str, episode: str, text: str) -> None:
    """The episode's MLflow trace, or how to make one: its transcript's first line names its partition."""
    import re

    from flows.inspection import trace_link

    where = re.search(r"iteration (\d+), phase (\S+?)[,)\s]", text)
    if where is None or not (run_dir / "mlflow_run_id").exists():
        return
    k, phase = int(where[1]), where[2]
    try:
        link = trace_link(run_dir, runs_dir, episode, k, phase)
    except USER_ERRORS:  # the run's MLflow database is elsewhere: the transcript stands without the link
        return
    hint = f"trace: {link}" if link else f"no MLflow trace yet: teamrl runs trace {run_dir.name} --iteration {k} --all"
    console.print(hint, markup=False, highlight=False, soft_wrap=True)


@runs_app.command("trace")
def runs_trace(
    run_id: str = typer.Argument(...),
    runs_dir: str = typer.Option("runs", "--dir", help="folder holding the runs"),
    iteration: int | None = typer.Option(None, help="only this iteration's partitions"),
    every: bool = typer.Option(False, "--all", help="every episode (default: what the run's run.traces chooses)"),
):
    """Write a run's episodes as MLflow traces from its tables (runs made before traces, or with
    run.traces=none); an episode traced before is not traced again."""
    from flows.inspection import trace_run
    from infra import runs

    try:
        run_dir = runs.find_run(runs_dir, run_id)
        written = trace_run(run_dir, runs_dir, iteration, every)
    except USER_ERRORS as e:
        user_error(e)
    for (k, phase), n in written.items():
        console.print(f"iteration {k}, {phase}: {n} new trace(s)", markup=False)
    console.print(
        f"{sum(written.values())} trace(s) written; in Python: flows.inspection.traces(run_dir)", markup=False
    )


def _episode_hint(run_id: str, runs_dir: str, run_dir: Path) -> None:
    """How to print one episode, with ids from the run's latest iteration."""
    from infra import store

    eps = store.load_episodes(run_dir)
    if not len(eps):
        return
    last = eps[eps["iteration"] == eps["iteration"].max()]
    examples = last.groupby("phase", sort=True)["episode_id"].min().head(2)
    it = int(last["iteration"].iloc[0])
    dir_opt = "" if runs_dir == "runs" else f" --dir {runs_dir}"
    console.print(
        f"one episode as a transcript: teamrl runs show {run_id}{dir_opt} --episode ID [--iteration K]; "
        f"e.g. at iteration {it}: {', '.join(examples)}",
        markup=False,
        highlight=False,
    )


@runs_app.command("export")
def runs_export(
    run_id: str = typer.Argument(..., help="run id (or run folder)"),
    fmt: str = typer.Option("jsonl", "--format", "-f", help="jsonl (one JSON object per action) or csv"),
    out: Path | None = typer.Option(
        None, "--out", help="file to write (default: <run folder>/export/<run_id>.<format>)"
    ),
    runs_dir: str = typer.Option("runs", "--dir", help="folder holding the runs"),
    tokens: bool = typer.Option(False, "--tokens", help="keep the per-token columns (ids, log-probs, advantages)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing file"),
):
    """Export a run as one flat table, one row per action: the action, its coach score and rationale,
    and its episode's question, answer, final answer, outcome and success."""
    from flows.inspection import FORMATS, export
    from infra import runs

    if fmt.lower() not in FORMATS:
        fail(f"unknown --format {fmt!r}; use one of: {', '.join(FORMATS)}")
    try:
        run_dir = runs.find_run(runs_dir, run_id)
        path, rows = export(run_dir, fmt, out, overwrite=overwrite, tokens=tokens)
    except USER_ERRORS as e:
        user_error(e)
    console.print(f"exported {rows} actions to {path}", markup=False, highlight=False)
