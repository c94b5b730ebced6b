"""prefect.yaml: generated from the presets and experiments/, one train deployment per preset whose
parameters are that preset's config exactly, train/sweep-run, one sweep deployment per sweep file whose
parameters are that file's SweepSpec exactly, plus evaluate and align, on the process work pool."""

from pathlib import Path

import pytest
import yaml

from flows.config import RunConfig, load_config, preset_names
from flows.deployments import POOL, render, sweep_files
from flows.sweep_spec import SweepSpec, load_sweep

ROOT = Path(__file__).resolve().parents[1]


def test_prefect_yaml_is_generated_from_the_current_presets():
    assert (ROOT / "prefect.yaml").read_text() == render(), (
        "prefect.yaml is stale: run `.venv/bin/python -m flows.deployments > prefect.yaml`"
    )


def test_each_preset_deployment_carries_exactly_that_preset():
    doc = yaml.safe_load(render())
    deps = {d["name"]: d for d in doc["deployments"]}
    sweeps = {load_sweep(f).name: f for f in sweep_files()}
    assert set(sweeps) and not set(sweeps) & set(preset_names())  # one name, one deployment in the UI's list
    assert set(deps) == {*preset_names(), "sweep-run", *sweeps, "evaluate", "align"}
    for name, f in sweeps.items():
        d = deps[name]
        assert d["entrypoint"] == "flows/sweep.py:sweep" and d["work_pool"]["name"] == POOL
        assert SweepSpec.model_validate(d["parameters"]["spec"]) == load_sweep(f)
    assert deps["sweep-run"]["entrypoint"] == "flows/train.py:train" and "parameters" not in deps["sweep-run"]
    for p in preset_names():
        d = deps[p]
        assert d["entrypoint"] == "flows/train.py:train" and d["work_pool"]["name"] == POOL
        assert RunConfig.model_validate(d["parameters"]["config"]) == load_config(p, [])
    for name, entry in (("evaluate", "flows/evaluate.py:evaluate"), ("align", "flows/align.py:align")):
        assert deps[name]["entrypoint"] == entry and "parameters" not in deps[name]
    scheduled = [d for d in deps.values() if d.get("schedules")]
    assert len(scheduled) == 1 and all(s["active"] is False for s in scheduled[0]["schedules"])
    assert doc["pull"] == [{"prefect.deployments.steps.set_working_directory": {"directory": "{{ $TEAMRL_HOME }}"}}]
    for d in deps.values():  # every entrypoint names a real flow
        path, fn = d["entrypoint"].split(":")
        assert f"def {fn}(" in (ROOT / path).read_text()


def test_each_deployments_parameters_meet_the_json_schema_prefect_enforces():
    """Prefect checks a deployment's parameters against the flow's JSON schema (`oneOf` for the pipeline
    section): a built-in pipeline's section must match exactly one member, the registered pipelines' one
    included (tests/quiz_plugin.py's section matches only that one)."""
    import jsonschema

    schema, sweep_schema = RunConfig.model_json_schema(), SweepSpec.model_json_schema()
    for d in yaml.safe_load(render())["deployments"]:
        if "config" in d.get("parameters", {}):
            jsonschema.validate(d["parameters"]["config"], schema)
        if "spec" in d.get("parameters", {}):
            jsonschema.validate(d["parameters"]["spec"], sweep_schema)
    jsonschema.validate({"pipeline": {"name": "quiz", "eval_size": 3}}, schema)
    with pytest.raises(jsonschema.ValidationError):  # not taken for a registered pipeline's section either
        jsonschema.validate({"pipeline": {"name": "mathchat", "families": "not a list"}}, schema)
