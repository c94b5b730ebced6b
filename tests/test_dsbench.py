"""DSBench: the team's programs run in a shared sandbox workspace and hand files to each other; the
submission is scored; the rubric blames the agent whose hand-off was missing; the coach-bias monitor.

The scripted team stands in for the LLM only (fixed programs as its replies): the pipeline, the sandbox,
scikit-learn and the scorer are the real ones."""

import pytest

from infra.generation import Generation
from pipelines.dsbench import EXAMPLES, HEAD_LINES, MODEL, DSBench, DSBenchConfig, program
from pipelines.dsbench.rubric import rubric_scores
from tasks.coach_bias import diverging

GOOD = {
    "data_engineer": """```python
import pandas as pd
tr, te = pd.read_csv("train.csv"), pd.read_csv("test.csv")
tr.to_csv("features_train.csv", index=False)
te.to_csv("features_test.csv", index=False)
```""",
    "modeler": """```python
import pandas as pd
from sklearn.linear_model import LogisticRegression, Ridge
tr, te = pd.read_csv("features_train.csv"), pd.read_csv("features_test.csv")
X = tr.drop(columns=["target"])
reg = tr["target"].nunique() > 20
m = (Ridge() if reg else LogisticRegression(max_iter=2000)).fit(X, tr["target"])
pd.DataFrame({"id": te["id"], "target": m.predict(te[X.columns])}).to_csv("predictions.csv", index=False)
print("fitted", type(m).__name__)
```""",
    "analyst": """```python
import pandas as pd
p = pd.read_csv("predictions.csv")
assert len(p) == len(pd.read_csv("test.csv"))
p.to_csv("submission.csv", index=False)
```""",
}


class ScriptedTeam:
    """An `Act` whose replies are fixed programs per agent."""

    def __init__(self, replies, tokenizer=None):
        self.replies, self.tokenizer, self.prompts = replies, tokenizer, []

    def __call__(self, agent, prompts):
        self.prompts.append((agent, prompts))
        reply = self.replies[agent]
        return [Generation([1], [2], [-0.5], reply(p) if callable(reply) else reply, False) for p in prompts]


@pytest.fixture(scope="module")
def pipe():
    """Replies are whole programs here: no examples in the prompts, no prefilled reply start."""
    cfg = DSBenchConfig(
        datasets=["diabetes", "iris"], train_size=4, eval_size=2, examples=False, scaffold="none", stop=[]
    )
    return DSBench(cfg, seed=0)


def test_program_extraction():
    assert program("```python\nprint(1)\n```") == "print(1)"
    assert program("import pandas as pd\npd.read_csv('x')") == "import pandas as pd\npd.read_csv('x')"
    assert program("I will build features.") is None


def test_a_working_team_gets_a_scored_submission(pipe):
    probs = pipe.problems("train")[:2]  # diabetes (regression), iris (classification)
    eps = pipe.run_episodes(probs, ["e0", "e1"], ["g0", "g1"], ScriptedTeam(GOOD))
    reg, cls = eps
    assert reg.success and cls.success, (reg.final_answer, cls.final_answer)
    assert 0 < reg.metrics["fair_rmse"] < 1 and reg.metrics["regression"] == 1.0
    assert cls.metrics["accuracy"] > cls.metrics["baseline_accuracy"] and cls.metrics["regression"] == 0.0
    assert all(e.metrics[f"{a}_ok"] == 1.0 for e in eps for a in GOOD) and reg.metrics["code_error"] == 0.0
    assert "fitted" in reg.actions[1]["tool_output"] and "predictions.csv" in reg.actions[1]["tool_output"]
    scores = [s for s, _ in rubric_scores(reg)]
    assert scores == [pytest.approx(6 + 4 * reg.outcome)] * 3 and reg.outcome > 0


def test_the_example_programs_work_after_the_scaffold():
    """With `examples` and `scaffold=head` (the defaults) each agent's prompt is the chat's tokens plus the
    prefilled opening of the example program; a team that writes the rest of it (the model class picked
    per task kind) gets a successful submission on regression and classification."""
    from infra.models import ModelConfig, load_tokenizer

    tok = load_tokenizer(ModelConfig(name="tiny"))
    pipe = DSBench(DSBenchConfig(datasets=["diabetes", "iris"], train_size=2, eval_size=1), seed=0)

    def finish_example(agent):
        def reply(ids):
            kind = "regression" if "(regression)" in tok.decode(ids) else "classification"
            return "\n".join(EXAMPLES[agent].format(model=MODEL[kind]).splitlines()[HEAD_LINES[agent] :]) + "\n```"

        return reply

    team = ScriptedTeam({a: finish_example(a) for a in EXAMPLES}, tok)
    probs = pipe.problems("train")
    eps = pipe.run_episodes(probs, ["e0", "e1"], ["g0", "g1"], team)
    assert all(e.success for e in eps), [e.final_answer for e in eps]
    for agent, prompts in team.prompts:
        for p, ids in zip(probs, prompts):
            text = tok.decode(ids)
            assert text.endswith(pipe._lead(agent, p)) and "A program that works:" in text
    assert (
        eps[0]
        .actions[1]["tool_input"]
        .startswith("import pandas as pd\nfrom sklearn.ensemble import RandomForestRegressor")
    )
    assert "RandomForestClassifier" in eps[1].actions[1]["tool_input"]


def test_missing_features_file_blames_the_data_engineer(pipe):
    """The Data Engineer's program runs but writes no features; the Modeler reports the missing file."""
    broken = GOOD | {"data_engineer": "```python\nimport pandas as pd\nprint(pd.read_csv('train.csv').shape)\n```"}
    (ep,) = pipe.run_episodes(pipe.problems("train")[:1], ["e"], ["g"], ScriptedTeam(broken))
    assert not ep.success and ep.metrics["data_engineer_ok"] == 0.0
    assert "features_train.csv" in ep.actions[1]["tool_output"]  # the Modeler's FileNotFoundError
    assert "invalid submission.csv" in ep.final_answer
    (de, _), (mo, why), (an, _) = rubric_scores(ep)
    assert de == 0.0 and mo is None and an is None and "data_engineer" in why


def test_failed_modeler_is_blamed_not_the_analyst(pipe):
    broken = GOOD | {"modeler": "```python\nraise SystemExit('no model')\n```"}
    (ep,) = pipe.run_episodes(pipe.problems("train")[1:2], ["e"], ["g"], ScriptedTeam(broken))
    assert [s for s, _ in rubric_scores(ep)] == [pytest.approx(6.0), 0.0, None]  # outcome 0: 6 + 4 * 0


def test_stop_strings_need_a_scaffold():
    with pytest.raises(ValueError, match="needs scaffold fence or head"):
        DSBenchConfig(scaffold="none")
    assert DSBenchConfig().stop == ["```", "\n\n"] and DSBenchConfig(scaffold="fence").stop


def test_coach_bias_divergence():
    assert diverging(0.5, 0.7, 0.3, 0.3)  # score up 0.2, metric flat
    assert not diverging(0.5, 0.7, 0.3, 0.4)  # both up
    assert not diverging(0.5, 0.52, 0.3, 0.1)  # score moved less than tol


@pytest.mark.slow
def test_dsbench_flow_runs_and_monitors_coach_bias(dsbench_run):
    from infra import store
    from tasks.coach_bias import by_task_type

    run_dir = dsbench_run
    eps = store.read_table(run_dir, "episodes", 1, "rollout")
    acts = store.load_actions(run_dir, 1, "rollout")
    assert set(acts["agent"]) == {"data_engineer", "modeler", "analyst"} and (acts["tool_name"] == "python").all()
    table = by_task_type(eps, acts, "regression")
    assert set(table.index) == {0.0, 1.0}  # diabetes and iris both played
    assert set(store.read_table(run_dir, "updates")["agent"]) == {"data_engineer", "modeler", "analyst"}
    # actions after an upstream failure are not scored and get no gradient
    coach, adv = (store.read_table(run_dir, t, 1, "rollout") for t in ("coach", "advantages"))
    skipped = coach["status"] == "skipped"
    assert skipped.any() and coach.loc[skipped, "score"].isna().all() and coach.loc[~skipped, "score"].notna().all()
    keys = lambda d: set(zip(d["episode_id"], d["turn"]))  # noqa: E731
    assert keys(coach[skipped]) == keys(adv[adv["weight"] == 0])


@pytest.mark.slow
def test_coach_bias_warning_reaches_metrics_and_a_prefect_artifact(prefect_harness, monkeypatch):
    """The monitor's wiring in the train flow: iteration 2's regression score rises while its metric
    does not -> a diverging metric and a markdown artifact; classification moves with its metric."""
    import pandas as pd
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    import flows.train as tr

    frames = {
        1: pd.DataFrame({"coach": [0.5, 0.4], "metric": [0.2, 0.3]}, index=[1.0, 0.0]),
        2: pd.DataFrame({"coach": [0.8, 0.6], "metric": [0.2, 0.5]}, index=[1.0, 0.0]),
    }
    calls = iter([2, 1])  # coach_bias_metrics reads iteration k, then k - 1
    monkeypatch.setattr(tr, "by_task_type", lambda *a: frames[next(calls)])
    monkeypatch.setattr(tr.store, "read_table", lambda *a, **k: None)
    monkeypatch.setattr(tr.store, "load_actions", lambda *a, **k: None)

    @flow
    def monitor():
        return tr.coach_bias_metrics("unused", 2, "regression", {1.0: "regression", 0.0: "classification"})

    m = monitor()
    assert m["coach_bias/regression/diverging"] == 1.0 and m["coach_bias/classification/diverging"] == 0.0
    assert m["coach_bias/regression/coach"] == 0.8 and m["coach_bias/classification/metric"] == 0.5
    with get_client(sync_client=True) as client:
        wanted = ArtifactFilter(key=ArtifactFilterKey(any_=["coach-bias-2-regression"]))
        arts = client.read_artifacts(artifact_filter=wanted)
    assert arts and "exploiting a coach bias" in arts[0].data
