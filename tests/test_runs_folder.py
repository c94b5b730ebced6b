"""One damaged run folder does not stop the others (infra/runs.py): a run whose config.yaml cannot be read
is skipped with a warning naming it when a new run starts, `teamrl runs list` shows it as damaged, and
resuming it fails with a message naming the file and the line."""

import logging
from contextlib import contextmanager

import pytest

from infra.runs import RunConfigError, create_run, find_by_flow_run, read_run_config

DAMAGED = {  # run id: (its config.yaml's bytes, or None for a folder in its place; what the error says)
    "invalid": (b"run_id: invalid\npreset: tiny\nseed: [1, 2\n", "line 4: not valid YAML"),
    "not-a-mapping": (b"- 1\n- 2\n", "line 1: a list, not a mapping"),
    "empty": (b"", "line 1: empty, not a mapping"),
    "not-utf8": (b"seed: 1\npreset: \xff\n", "line 2: not UTF-8"),
    "control-character": (b"seed: 1\npreset: \x01\n", "line 2: not valid YAML"),
    "unreadable": (None, "cannot be read"),
}


@contextmanager
def warnings_logged():
    """The warnings of infra.runs, caught on its own logger (Prefect reconfigures the root logger's handlers)."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("infra.runs")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def unwrapped(text: str) -> str:
    """`text` without its whitespace: a terminal-width console may break a long path anywhere."""
    return "".join(text.split())


def damage(root, run_id):
    path = root / run_id / "config.yaml"
    content = DAMAGED[run_id][0]
    if content is None:
        path.mkdir(parents=True)
    else:
        path.parent.mkdir(parents=True)
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("run_id", DAMAGED)
def test_reading_a_damaged_config_names_the_file_and_the_line(tmp_path, run_id):
    path = damage(tmp_path, run_id)
    with pytest.raises(RunConfigError) as e:
        read_run_config(path.parent)
    assert str(e.value).startswith(f"{path}") and DAMAGED[run_id][1] in str(e.value)


def test_finding_a_flow_runs_run_skips_damaged_runs_with_a_warning(tmp_path):
    paths = {run_id: damage(tmp_path, run_id) for run_id in DAMAGED}
    mine = create_run(tmp_path, "mine", {"seed": 1}, flow_run_id="flow-run-1")
    assert find_by_flow_run(tmp_path, "flow-run-1") == mine
    with warnings_logged() as records:
        assert find_by_flow_run(tmp_path, "flow-run-2") is None  # every run read
    warnings = [r.getMessage() for r in records]
    assert len(warnings) == len(DAMAGED)
    for run_id, path in paths.items():
        assert any(w.startswith(f"skipping run {run_id!r}: {path}") and DAMAGED[run_id][1] in w for w in warnings)


@pytest.mark.slow
def test_a_damaged_run_stops_neither_new_runs_nor_runs_list(prefect_harness, tmp_path):
    """The CLI: a new run trains beside the damaged one, which `runs list` shows as damaged, and resuming
    the damaged run stops at once (exit 2) with the file and the line."""
    from typer.testing import CliRunner

    from flows.cli import app

    path = damage(tmp_path, "invalid")
    runner = CliRunner()
    with warnings_logged() as records:
        res = runner.invoke(
            app,
            [
                "train",
                "tiny",
                "--set",
                f"run.dir={tmp_path}",
                "--set",
                "iterations=1",
                "--set",
                "evaluate=false",
                "--set",
                "run.id=new",
            ],
        )
    assert res.exit_code == 0, res.output
    assert [r.getMessage().split(" (")[0] for r in records] == [
        f"skipping run 'invalid': {path}, line 4: not valid YAML"
    ]
    assert read_run_config(tmp_path / "new")["run_id"] == "new"

    res = runner.invoke(app, ["train", "tiny", "--set", f"run.dir={tmp_path}", "--resume", "invalid"])
    assert res.exit_code == 2, res.output
    assert unwrapped(f"error: {path}, line 4: not valid YAML") in unwrapped(res.output)
    assert path.read_bytes() == DAMAGED["invalid"][0]  # left as it was, for its owner to fix

    res = runner.invoke(app, ["runs", "list", "--dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rows = {line.split()[1]: line for line in res.output.splitlines() if line.startswith("│")}
    assert "tiny" in rows["new"] and "damaged" in rows["invalid"]
    assert f"{path}, line 4: not valid YAML" in res.output
