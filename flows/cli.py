"""The `teamrl` command line: train, eval, align (here) and runs list / show / export (flows/cli_runs.py)."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from flows.cli_common import USER_ERRORS, console, err, fail, flow_session, show_table, user_error
from flows.cli_runs import runs_app
from flows.cli_sweep import report_cmd, sweep_cmd
from flows.config import load_config, preset_names, validate
from tasks.align import AlignConfig

app = typer.Typer(
    help="Fine-tune teams of LLM agents with reinforcement learning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(runs_app, name="runs")
app.command("sweep")(sweep_cmd)
app.command("report")(report_cmd)


@app.command()
def train(
    preset: str = typer.Argument(..., help=f"preset name ({', '.join(preset_names())}) or a YAML file"),
    overrides: list[str] | None = typer.Argument(None, help="more key=value overrides"),
    set_: list[str] | None = typer.Option(None, "--set", help="override a config field: --set seed=3"),
    resume: str | None = typer.Option(
        None,
        "--resume",
        help="finish run RUN_ID (its saved config is used; --set iterations=N trains it on to N iterations)",
    ),
):
    """Train a team with a preset (or YAML file), e.g. `teamrl train tiny --set iterations=2`."""
    try:
        cfg = load_config(preset, (set_ or []) + (overrides or []))
    except USER_ERRORS as e:
        user_error(e)
    from flows.report import run_table
    from flows.train import train as train_flow
    from infra.interrupt import by_ctrl_c
    from infra.runs import new_run_id

    keys = {kv.split("=", 1)[0].strip() for kv in (set_ or []) + (overrides or [])}
    if resume and (ignored := sorted(keys - {"iterations", "run.dir"})):
        err.print(f"[yellow]note:[/] with --resume the run's saved config is used; ignoring {', '.join(ignored)}")
    if resume:
        rid = resume
    else:  # named here, so that a message can say how to resume it
        rid = cfg.run.id or new_run_id(cfg.preset)
        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"id": rid})})
    finish = f"`teamrl train {preset} --set run.dir={cfg.run.dir} --resume {rid}`"
    try:
        with flow_session():
            run_dir = train_flow(
                config=cfg, resume=resume, iterations=cfg.iterations if resume and "iterations" in keys else None
            )
    except KeyboardInterrupt:
        _interrupted(finish, None if resume else Path(cfg.run.dir) / rid)
    except USER_ERRORS as e:  # refused before the run's folder was made: nothing to finish
        user_error(e, finish if (Path(cfg.run.dir) / rid).exists() else None)
    except Exception as e:  # the traceback, then how to finish the run
        if by_ctrl_c(e):
            _interrupted(finish, None if resume else Path(cfg.run.dir) / rid)
        import traceback

        traceback.print_exc()
        fail(
            f"training stopped ({type(e).__name__}: {e}). Finished stages are kept: finish the run with {finish}, "
            "or `prefect flow-run retry <flow run> --entrypoint flows/train.py:train`.",
            code=1,
        )
    console.print(f"[green]run finished:[/] {run_dir}")
    show_table(run_table(run_dir), Path(run_dir).name)
    _before_after(Path(run_dir))


def _interrupted(finish: str, new_run: Path | None) -> None:
    """Exit after a Ctrl-C (infra/interrupt.py then ends the process by SIGINT) with how to `finish` the run,
    unless the run this command was to create (`new_run`; None with --resume) was not created yet."""
    from infra.faults import crash_point

    crash_point("interrupted")
    if new_run and not (new_run / "config.yaml").exists():
        fail("interrupted before the run started", code=130)
    fail(f"interrupted. Finished stages are kept: finish the run with {finish}", code=130)


def _before_after(run_dir: Path) -> None:
    from flows.report import compact, run_table

    ev = compact(run_table(run_dir))
    ev = ev[ev["phase"] == "eval"]
    if len(ev) >= 2:
        a, b = ev.iloc[0], ev.iloc[-1]
        console.print(
            f"held-out success (greedy, 95% CI): [bold]{a['success']:.3f}[/] [{a['ci low']:.3f}, "
            f"{a['ci high']:.3f}] untrained -> [bold]{b['success']:.3f}[/] [{b['ci low']:.3f}, "
            f"{b['ci high']:.3f}] after {int(b['iteration'])} iterations"
        )
    if len(ev) >= 3:
        from tasks.evaluation import regressions

        console.print(
            f"held-out curve: {' -> '.join(f'{v:.3f}' for v in ev['success'])} "
            f"({regressions(ev['success'])} regressions)"
        )
    if (run_dir / "summary.png").exists():
        console.print(f"plot: {run_dir / 'summary.png'}")


@app.command("eval")
def eval_cmd(
    run_id: str | None = typer.Argument(
        None,
        help="run id (or run folder); with --model: the team the models "
        "join (default: the run that registered the first one)",
    ),
    iteration: int | None = typer.Option(None, help="policy iteration to evaluate (default: the latest)"),
    runs_dir: str = typer.Option("runs", "--dir", help="folder holding the runs"),
    model: list[str] | None = typer.Option(
        None,
        "--model",
        help="an agent from the MLflow registry, e.g. models:/mathchat-smol-solver@best (repeat for more agents)",
    ),
    tracking_uri: str | None = typer.Option(None, help="MLflow tracking URI (default: sqlite:///<dir>/mlflow.db)"),
    problems: Path | None = typer.Option(
        None,
        "--problems",
        help="your own problems, a JSONL file in the run's "
        "pipeline's format (README: `Evaluate on your own problems`), played in "
        "place of the held-out split in a new run folder `eval-...`",
    ),
    docs: Path | None = typer.Option(
        None,
        "--docs",
        help="with --problems on deepresearch: JSONL of documents "
        "{id, title?, text} searched in place of the run's corpus",
    ),
):
    """Evaluate a run's team on the held-out split (greedy), with a 95% bootstrap interval; with --model, the
    team with registered agents in place of the run's own; with --problems, on your own problem file, with a
    per-problem table (both played in a new run folder `eval-...`)."""
    from flows.evaluate import evaluate, last_iteration, problems_team, registered_team
    from infra import runs
    from infra.tracking import default_tracking_uri
    from tasks import context

    if not run_id and not model:
        fail("give a RUN_ID, or --model models:/<name>@<alias> (see `teamrl runs list`)")
    if model and iteration is not None:
        fail("--iteration does not apply with --model: the registered agents play with the run's latest team")
    if docs and not problems:
        fail("--docs goes with --problems: the documents your questions are asked over")
    try:
        if model:
            run_dir = registered_team(
                runs_dir, model, tracking_uri or default_tracking_uri(runs_dir), run_id, problems, docs
            )
            at = 0
            console.print(f"team with {', '.join(model)}: {run_dir}")
        else:
            assert run_id is not None  # refused above without a run id or a model
            run_dir = runs.find_run(runs_dir, run_id)
            at = last_iteration(run_dir) if iteration is None else iteration
            if problems:
                source, run_dir = run_dir, problems_team(runs_dir, run_dir, at, problems, docs)
                console.print(f"{source.name}'s team at iteration {at}: {run_dir}")
                at = 0
        if user := runs.read_run_config(run_dir).get("problems"):  # a file changed since: refused here
            context.RunContext(run_dir).problems("eval")
    except USER_ERRORS as e:
        user_error(e)
    finish = (
        f"`teamrl eval {run_dir.name} --dir {runs_dir}` finishes the rest"
        if model or problems
        else "the same command finishes the rest"
    )
    with runs.run_lock(run_dir):
        try:
            with flow_session():
                m = evaluate(str(run_dir), at)
        except KeyboardInterrupt:
            fail(f"interrupted. Finished evaluation partitions are kept: {finish}", code=130)
        except USER_ERRORS as e:  # e.g. the iteration's checkpoints were pruned (checkpoint.keep_every)
            user_error(e)
    what = f"your problems ({Path(user['file']).name})" if user else f"held-out evaluation at iteration {at}"
    t = Table(title=f"{run_dir.name}: {what}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in m.items():
        t.add_row(k, f"{v:.3f}")
    console.print(t)
    if user:
        _problems_report(run_dir, at, m, runs_dir)


def _problems_report(run_dir: Path, iteration: int, m: dict[str, float], runs_dir: str) -> None:
    """After `eval --problems`: success with its interval, one row per problem, and the run exported as CSV."""

    from flows.inspection import export
    from flows.report import problem_table

    df = problem_table(run_dir, iteration)
    t = Table(title=f"{run_dir.name}: per problem (greedy)")
    for c in df.columns:
        t.add_column(c, overflow="fold")
    for row in df.itertuples(index=False):
        t.add_row(*(escape(str(v)) for v in row))  # a question may hold [brackets]: text, not markup
    console.print(t)
    if "success_rate" in m:
        console.print(
            f"success (greedy, 95% bootstrap CI): [bold]{m['success_rate']:.3f}[/] "
            f"[{m['success_ci_low']:.3f}, {m['success_ci_high']:.3f}] on "
            f"{int((df['success'] != 'infra error').sum())} problems",
            highlight=False,
        )
    path, _ = export(run_dir, "csv", overwrite=True)  # derived from the finished partitions: the same each time
    dir_opt = "" if runs_dir == "runs" else f" --dir {runs_dir}"
    console.print(
        f"every action: {path} (JSONL: teamrl runs export {run_dir.name}{dir_opt})",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _align_help(field: str) -> str:
    return AlignConfig.model_fields[field].description or ""


@app.command()
def align(
    run_id: str = typer.Argument(..., help="run id (or run folder)"),
    agent: str = typer.Option(..., "--agent", help=_align_help("agent")),
    init: str = typer.Option("fresh", "--init", help=_align_help("init")),
    delta0: float = typer.Option(AlignConfig.model_fields["delta0"].default, "--delta0", help=_align_help("delta0")),
    max_steps: int = typer.Option(
        AlignConfig.model_fields["max_steps"].default, "--max-steps", help=_align_help("max_steps")
    ),
    probe_size: int = typer.Option(
        AlignConfig.model_fields["probe_size"].default, "--probe-size", help=_align_help("probe_size")
    ),
    lr: float | None = typer.Option(None, "--lr", help=_align_help("lr")),
    runs_dir: str = typer.Option("runs", "--dir", help="folder holding the runs"),
):
    """Swap AGENT for a new model and align it first (TeamTR's Stage-0): minimise the reverse KL
    D_KL(new || old) on the contexts the team produced at the agent's turns in the latest training
    rollouts, until it is <= delta0. Saves the aligned agent as its next checkpoint version and compares
    held-out success before the swap, after a direct swap, and after the alignment. Only `--init fresh`
    (a new agent on the run's base model) is supported; another base model or size is out of scope."""
    from flows.align import align as align_flow
    from flows.align import plan
    from infra import runs
    from tasks.context import RunContext

    try:
        cfg = validate(
            {
                "agent": agent,
                "init": init,
                "delta0": delta0,
                "max_steps": max_steps,
                "probe_size": probe_size,
                "lr": lr,
            },
            AlignConfig,
        )
        run_dir = runs.find_run(runs_dir, run_id)
        with RunContext(run_dir) as run:
            plan(run, cfg)  # refused before a Prefect server starts
        with flow_session():
            result = align_flow(str(run_dir), cfg)
    except KeyboardInterrupt:
        fail("interrupted; run the same command again to align the agent", code=130)
    except USER_ERRORS as e:
        user_error(e)
    _swap_table(result)


def _swap_table(r: dict) -> None:
    """The swap shock: held-out success before the swap, after a direct swap, after Stage-0."""
    a, k = r["agent"], r["iteration"]
    console.print(
        f"stage-0 {a} (run {Path(r['run_dir']).name}, iteration {k}, probe {r['probe_actions']} actions / "
        f"{r['probe_tokens']} tokens): reverse KL [bold]{r['kl_before']:.4g}[/] -> [bold]{r['kl_after']:.4g}"
        f"[/] in {r['steps']} steps (delta0 {r['delta0']:g})"
    )
    if not r["converged"]:
        console.print("[yellow]delta0 not reached: raise --max-steps or --lr[/]")
    t = Table(title=f"held-out success (greedy, 95% CI) around the swap of {a}")
    for c in ("team", "partition", f"{a} version", "success", "ci low", "ci high", "vs before"):
        t.add_column(c, justify="left" if c in ("team", "partition") else "right")
    before = r["eval"]["eval"]
    rows = (
        ("before the swap", "eval", r["team"][a]),
        ("swap, no stage-0", f"eval-swap-{a}", 0),
        ("stage-0 aligned", f"eval-aligned-{a}", r["version_after"]),
    )
    for label, phase, version in rows:
        m = r["eval"][phase]
        if m is None:
            t.add_row(label, phase, str(version), "not evaluated", "-", "-", "-")
            continue
        diff = "-" if before is None else f"{m['success_rate'] - before['success_rate']:+.3f}"
        t.add_row(
            label,
            phase,
            str(version),
            f"{m['success_rate']:.3f}",
            f"{m['success_ci_low']:.3f}",
            f"{m['success_ci_high']:.3f}",
            diff,
        )
    console.print(t)


def main():  # pragma: no cover
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
