"""Run config loading, `--set` overrides and their errors (flows/config.py), and the CLI's refusal."""

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.config import ConfigError, load_config, preset_names


def test_tiny_preset_loads():
    cfg = load_config("tiny")
    assert cfg.preset == "tiny"
    assert cfg.pipeline.name == "mathchat" and cfg.coach.backend == "rubric"
    assert cfg.algorithm.estimator == "reinforce_pp"


def test_overrides_apply():
    cfg = load_config(
        "tiny",
        [
            "seed=3",
            "run.dir=/x",
            "coach.backend=llm",
            "algorithm.return_scope=agent",
            "pipeline.max_new_tokens.solver=5",
            "pipeline.families=[arith]",
            "run.id=my-run.1",
        ],
    )
    assert cfg.seed == 3 and cfg.run.dir == "/x" and cfg.coach.backend == "llm"
    assert cfg.algorithm.return_scope == "agent"
    assert cfg.pipeline.max_new_tokens == {"solver": 5, "executor": 24, "verifier": 8}  # sibling keys kept
    assert cfg.pipeline.families == ["arith"] and cfg.run.id == "my-run.1"


def test_yaml_file_path_works(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("seed: 9\niterations: 1\n")
    cfg = load_config(str(p))
    assert (cfg.preset, cfg.seed, cfg.iterations) == ("mine", 9, 1)


@pytest.mark.parametrize(
    "override, field",
    [
        ("bogus.key=1", "bogus"),  # unknown section
        ("coach.bogus=1", "coach.bogus"),  # unknown key in a section
        ("seed=abc", "seed"),  # wrong type
        ("iterations=1.5", "iterations"),
        ("algorithm.clip_eps=5", "algorithm.clip_eps"),  # out of range
        ("seed=-1", "seed"),
        ("algorithm.estimator=ppo", "algorithm.estimator"),  # unknown estimator
        ("algorithm.kl_estimator=k9", "algorithm.kl_estimator"),
        ("noequals", "noequals"),  # malformed override
        ("=3", "=3"),
        ("seed.x=1", "seed"),  # a value used as a section
    ],
)
def test_bad_override_names_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config("tiny", [override])


def test_unknown_estimator_lists_the_choices():
    with pytest.raises(ConfigError) as e:
        load_config("tiny", ["algorithm.estimator=ppo"])
    assert all(name in str(e.value) for name in ("reinforce_pp", "grpo", "rloo"))


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_kl_coef_is_refused_where_the_estimator_has_no_kl_term(estimator):
    with pytest.raises(ConfigError, match=f"kl_coef=0.01 does nothing with estimator {estimator}"):
        load_config("tiny", [f"algorithm.estimator={estimator}"])
    assert load_config("tiny", [f"algorithm.estimator={estimator}", "algorithm.kl_coef=0"]).algorithm.kl_coef == 0


def test_unknown_preset_lists_presets():
    with pytest.raises(ConfigError) as e:
        load_config("no-such-preset")
    assert "no-such-preset" in str(e.value)
    assert "tiny" in preset_names() and all(p in str(e.value) for p in preset_names())


@pytest.mark.parametrize("field, value", [("id", "123"), ("dir", "2024")])
def test_numeric_looking_string_override(field, value):
    assert getattr(load_config("tiny", [f"run.{field}={value}"]).run, field) == value


def test_cli_train_rejects_bad_override_before_writing(tmp_path):
    runs = tmp_path / "runs"
    res = CliRunner().invoke(app, ["train", "tiny", "--set", "bogus.key=1", "--set", f"run.dir={runs}"])
    assert res.exit_code == 2, res.output
    assert "bogus" in res.output
    assert not runs.exists() and list(tmp_path.iterdir()) == []
