"""A pipeline registered from outside the package (tests/quiz_plugin.py) through the run's `plugins`, as
docs/guides/extending.md tells a user to add one: it validates, trains through the real flow, and a fresh
process that opens the run folder finds it by the saved config alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows.config import load_config
from tasks.config import ConfigError

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def quiz_preset(tmp_path: Path) -> Path:
    """The tiny preset with the quiz pipeline in place of MathChat (its `pipeline` section is MathChat's)."""
    raw = yaml.safe_load((ROOT / "flows" / "presets" / "tiny.yaml").read_text())
    raw |= {"plugins": ["quiz_plugin"], "pipeline": {"name": "quiz", "train_size": 16, "eval_size": 4}}
    path = tmp_path / "quiz-tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_config_names_a_pipeline_its_plugin_registers(tmp_path):
    cfg = load_config(str(quiz_preset(tmp_path)), ["pipeline.eval_size=3"])
    assert type(cfg.pipeline).__name__ == "QuizConfig" and cfg.pipeline.eval_size == 3
    assert cfg.model_dump(mode="json")["pipeline"] == {
        "name": "quiz",
        "train_size": 16,
        "eval_size": 3,
        "max_new_tokens": {"answerer": 8},
    }
    with pytest.raises(ConfigError, match="unknown field"):  # the plugin's own model checks its section
        load_config(str(quiz_preset(tmp_path)), ["pipeline.families=[arith]"])


def test_an_unknown_pipeline_or_plugin_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown pipeline 'quiz2'; known: .*dsbench.*mathchat"):
        load_config("tiny", ["pipeline={name: quiz2}"])
    with pytest.raises(ConfigError, match="plugins: cannot import 'no_such_plugin': No module named"):
        load_config("tiny", ["plugins=[no_such_plugin]"])


@pytest.mark.slow
def test_a_plugin_pipeline_trains_and_its_run_reopens_in_a_fresh_process(prefect_harness, tmp_path):
    from flows.train import train
    from infra import store

    cfg = load_config(str(quiz_preset(tmp_path)), [f"run.dir={tmp_path}", "run.id=quiz", "iterations=1"])
    run_dir = Path(train(config=cfg))
    acts = store.read_table(run_dir, "actions", 1, "rollout")
    assert set(acts["agent"]) == {"answerer"} and len(acts) == 8  # 4 questions x groups of 2, one turn each
    assert all(q.startswith("What is") for q in store.read_table(run_dir, "episodes", 1, "rollout")["question"])
    [row] = store.read_table(run_dir, "updates").to_dict("records")
    assert row["agent"] == "answerer" and row["version_after"] == 1
    assert len(store.read_table(run_dir, "episodes", 1, "eval")) == 4  # held-out: eval_size, greedy
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["plugins"] == ["quiz_plugin"]
    # a process that knows nothing of the plugin (a resume, `teamrl eval`, a Ray worker) reads it from the run
    code = "import sys; from tasks.context import RunContext; print(RunContext(sys.argv[1]).pipeline.agents[0].name)"
    env = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(run_dir)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.split() == ["answerer"], out.stderr[-2000:]
