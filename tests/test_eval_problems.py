"""`teamrl eval RUN --problems FILE`: a run's team on a user's own problem file, per pipeline. The file is
parsed by the pipeline (`load_problems`) and refused, with its file and line, before any model loads;
a good file is played greedily in a new folder `eval-<run>-...`, the source run untouched."""

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.config import load_config
from infra import runs, store
from infra.policy import saved_checkpoint
from pipelines.deepresearch import DeepResearch, DeepResearchConfig
from pipelines.deepresearch.corpus import ResearchProblem
from pipelines.dsbench import DSBench, DSBenchConfig, data
from pipelines.mathchat import MathChat, MathChatConfig

AGENTS = ["solver", "executor", "verifier"]
MATH = [
    {"question": "What is 6 times 7?", "answer": 42},
    {"question": "What is 10 minus 3?", "answer": "7"},
    {"question": "What is 2 plus 2?", "answer": 4},
]
DOCS = [
    {"id": "d1", "title": "Quill Harbor", "text": "Quill Harbor was founded by Mira Dask in 1712."},
    {"id": "d2", "title": "Mira Dask", "text": "Mira Dask was born in the city of Ostvale."},
]
QUESTIONS = [
    {"question": "Who founded Quill Harbor?", "answer": "Mira Dask"},
    {"question": "In what year was Quill Harbor founded?", "answer": 1712},
]


def jsonl(path: Path, rows: list) -> Path:
    """Write `rows` one a line: a dict as JSON, a string as it is (a bad line)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def csv_files(folder: Path) -> None:
    """houses.csv (regression, target `price`) and flowers.csv (classification, integer `kind`), 40 rows each."""
    r = np.random.default_rng(0)
    x = r.normal(size=(40, 2))
    pd.DataFrame({"Size m2": x[:, 0], "rooms": x[:, 1], "price": 3 * x[:, 0] + r.normal(size=40)}).to_csv(
        folder / "houses.csv", index=False
    )
    pd.DataFrame({"petal": x[:, 0], "sepal": x[:, 1], "kind": (x[:, 0] > 0).astype(int)}).to_csv(
        folder / "flowers.csv", index=False
    )


TASKS = [
    {"csv": "houses.csv", "target": "price", "metric": "rmse", "threshold": 2.5},
    {"csv": "flowers.csv", "target": "kind", "metric": "f1", "name": "flowers"},
]


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# --- parsing, per pipeline (no model) ----------------------------------------------------------------------------


def test_mathchat_reads_integer_answers(tmp_path):
    got = MathChat(MathChatConfig(), 0).load_problems(
        str(jsonl(tmp_path / "p.jsonl", MATH + [{"question": "Big?", "answer": " 1,234 "}]))
    )
    want = [(m["question"], str(m["answer"])) for m in MATH] + [("Big?", "1234")]
    assert [(p.question, p.answer) for p in got] == want


def test_deepresearch_questions_over_the_run_corpus_or_given_documents(tmp_path):
    pipe = DeepResearch(DeepResearchConfig(), 0)
    q = jsonl(tmp_path / "q.jsonl", QUESTIONS)
    plain = pipe.load_problems(str(q))
    assert [(p.question, p.answer, p.docs) for p in plain] == [
        ("Who founded Quill Harbor?", "Mira Dask", ""),
        ("In what year was Quill Harbor founded?", "1712", ""),
    ]
    over = pipe.load_problems(str(q), str(jsonl(tmp_path / "d.jsonl", DOCS)))
    assert all(isinstance(p, ResearchProblem) and p.docs == str(tmp_path / "d.jsonl") for p in over)
    assert [d.title for d in pipe._search_index(over[0]).search("Quill Harbor founded", 2)] == ["Quill Harbor"]
    assert pipe._search_index(plain[0]) is pipe.index  # no documents file: the run's own corpus


def test_dsbench_tasks_name_a_csv_target_and_metric(tmp_path):
    csv_files(tmp_path)
    tasks = [TASKS[0], TASKS[1] | {"csv": str(tmp_path / "flowers.csv")}]  # relative to the task file, or absolute
    reg, cls = DSBench(DSBenchConfig(), 0).load_problems(str(jsonl(tmp_path / "t.jsonl", tasks)))
    assert (reg.kind, reg.metric, reg.threshold, reg.answer) == ("regression", "rmse", 2.5, "RMSE at most 2.5")
    assert (cls.kind, cls.dataset, cls.answer) == (
        "classification",
        "flowers",
        "macro F1 above the majority-class baseline",
    )
    assert "Dataset `houses` (regression). train.csv has 30 rows, 2 feature columns" in reg.question
    train, test, truth = data.split(reg)
    assert list(train.columns) == ["size_m2", "rooms", "target"] and list(test.columns) == ["id", "size_m2", "rooms"]
    ws = tmp_path / "ws"
    ws.mkdir()
    pd.DataFrame({"id": truth.index, "target": truth.to_numpy()}).to_csv(ws / "submission.csv", index=False)
    assert data.score_submission(reg, ws).metrics["success"] == 1.0  # rmse 0 <= 2.5
    pd.DataFrame({"id": truth.index, "target": truth.to_numpy() + 3}).to_csv(ws / "submission.csv", index=False)
    assert data.score_submission(reg, ws).metrics["success"] == 0.0  # rmse 3 > 2.5
    _, _, labels = data.split(cls)
    pd.DataFrame({"id": labels.index, "target": labels.to_numpy()}).to_csv(ws / "submission.csv", index=False)
    s = data.score_submission(cls, ws)
    assert s.metrics["f1"] == 1.0 > s.metrics["baseline_f1"] and s.metrics["success"] == 1.0


# --- bad input: `error: ...`, exit 2, nothing written -------------------------------------------------------------


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    """Run folders of the three tiny presets at iteration 0 (never trained: the initial weights play)."""
    root = tmp_path_factory.mktemp("runs")
    for rid, preset in (("math", "tiny"), ("dr", "deepresearch-tiny"), ("ds", "dsbench-tiny")):
        runs.create_run(root, rid, load_config(preset, [f"run.dir={root}", f"run.id={rid}"]).model_dump(mode="json"))
    return root


def eval_cli(root: Path, *args: str):
    return CliRunner().invoke(app, ["eval", *args, "--dir", str(root)])


BAD = [  # (run, problem lines, file:line or file, message); {tmp} is the test's folder
    ("math", None, "p.jsonl", "no such file"),
    ("math", [], "p.jsonl", "empty file"),
    ("math", [MATH[0], '{"question": "x", '], "p.jsonl:2", "invalid JSON"),
    ("math", ['["What is 1?", 1]'], "p.jsonl:1", "expected a JSON object, got list"),
    ("math", [{"question": "x"}], "p.jsonl:1", "missing field(s) answer"),
    ("math", [MATH[0], MATH[1] | {"id": 3}], "p.jsonl:2", "unknown field(s) id"),
    ("math", [{"question": 7, "answer": 7}], "p.jsonl:1", "question must be a string, got 7"),
    ("math", [{"question": "x", "answer": "four"}], "p.jsonl:1", 'answer must be an integer, got "four"'),
    ("math", [{"question": "x", "answer": 4.5}], "p.jsonl:1", "answer must be a string or an integer, got 4.5"),
    ("math", [{"question": "x", "answer": True}], "p.jsonl:1", "answer must be a string or an integer, got true"),
    ("math", [{"question": " ", "answer": 1}], "p.jsonl:1", "empty question"),
    ("dr", [QUESTIONS[0], {"question": "y"}], "p.jsonl:2", "missing field(s) answer"),
    ("dr", [QUESTIONS[0] | {"support": ["d1"]}], "p.jsonl:1", "unknown field(s) support"),
    ("ds", [TASKS[0] | {"csv": "nope.csv"}], "p.jsonl:1", "no such CSV file {tmp}/nope.csv"),
    ("ds", [TASKS[0], TASKS[1] | {"target": "label"}], "p.jsonl:2", "has no column 'label'; its columns: petal"),
    ("ds", [TASKS[0] | {"metric": "mae"}], "p.jsonl:1", "unknown metric 'mae'; supported: rmse, accuracy, f1"),
    ("ds", [TASKS[0] | {"threshold": "2"}], "p.jsonl:1", "threshold must be an integer or a number"),
    ("ds", [TASKS[0] | {"target": "rooms", "metric": "accuracy"}], "p.jsonl:1", "needs integer class labels"),
    ("ds", [{"csv": "houses.csv", "metric": "rmse"}], "p.jsonl:1", "missing field(s) target"),
]


@pytest.mark.parametrize("rid, lines, where, message", BAD)
def test_bad_problem_files_are_refused_with_file_and_line(untrained, tmp_path, rid, lines, where, message):
    csv_files(tmp_path)
    if lines is not None:
        jsonl(tmp_path / "p.jsonl", lines)
    before = sorted(p.name for p in untrained.iterdir())
    res = eval_cli(untrained, rid, "--problems", str(tmp_path / "p.jsonl"))
    assert res.exit_code == 2, res.output
    assert f"error: {tmp_path / where}" in res.output and message.format(tmp=tmp_path) in res.output, res.output
    assert "Traceback" not in res.output
    assert sorted(p.name for p in untrained.iterdir()) == before  # no eval folder made


@pytest.mark.parametrize(
    "rid, docs, message",
    [
        ("math", True, "the mathchat pipeline takes no documents file (--docs)"),
        ("ds", True, "the dsbench pipeline takes no documents file (--docs)"),
        ("dr", [DOCS[0], {"id": "d2", "title": "no text"}], "d.jsonl:2: missing key(s) text"),
        ("dr", None, "d.jsonl: no such file"),
    ],
)
def test_documents_files_are_checked(untrained, tmp_path, rid, docs, message):
    problems = jsonl(tmp_path / "p.jsonl", {"math": MATH, "dr": QUESTIONS, "ds": TASKS}[rid])
    csv_files(tmp_path)
    if docs is not None:
        jsonl(tmp_path / "d.jsonl", DOCS if docs is True else docs)
    res = eval_cli(untrained, rid, "--problems", str(problems), "--docs", str(tmp_path / "d.jsonl"))
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output, res.output


def test_option_errors(untrained, tmp_path):
    problems = jsonl(tmp_path / "p.jsonl", MATH)
    res = eval_cli(untrained, "math", "--docs", str(problems))
    assert res.exit_code == 2 and "--docs goes with --problems" in res.output, res.output
    res = eval_cli(untrained, "math", "--problems", str(problems), "--iteration", "3")
    assert res.exit_code == 2 and "run math has policy iterations 0..0, not 3" in res.output, res.output


# --- the team plays the file ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mathchat_run(prefect_harness, tmp_path_factory):
    """The tiny preset trained one iteration, without held-out evaluation."""
    from flows.train import train

    root = tmp_path_factory.mktemp("runs")
    run_dir = train(config=load_config("tiny", [f"run.dir={root}", "run.id=mine", "iterations=1", "evaluate=false"]))
    return root, Path(run_dir)


def only_new(root: Path, before: set[str]) -> Path:
    (new,) = [p for p in root.iterdir() if p.name not in before]
    return new


@pytest.mark.slow
def test_mathchat_team_plays_your_problems_in_a_new_folder(mathchat_run, tmp_path):
    root, source = mathchat_run
    problems = jsonl(tmp_path / "mine.jsonl", MATH)
    digest, before = tree_digest(source), {p.name for p in root.iterdir()}
    res = eval_cli(root, "mine", "--problems", str(problems))
    assert res.exit_code == 0, res.output
    folder = only_new(root, before)
    assert folder.name.startswith("eval-mine-") and tree_digest(source) == digest  # the source run untouched
    cfg = runs.read_run_config(folder)
    assert cfg["problems"] == {
        "file": str(problems),
        "docs": None,
        "sha256": {"file": hashlib.sha256(problems.read_bytes()).hexdigest()},
    }
    versions = store.agent_versions(source, AGENTS, 1)
    assert cfg["source"] == {"run": str(source), "iteration": 1, "versions": versions} and 1 in versions.values()
    for agent, v in versions.items():  # the team after iteration 1, as version 0
        if theirs := saved_checkpoint(source, agent, v):
            ours = folder / "checkpoints" / agent / "v0000" / "adapter_model.safetensors"
            assert ours.read_bytes() == (theirs / "adapter_model.safetensors").read_bytes()
    eps = store.read_table(folder, "episodes", 0, "eval").sort_values("episode_id")
    assert eps["question"].tolist() == [m["question"] for m in MATH]
    assert eps["answer"].tolist() == [str(m["answer"]) for m in MATH]
    assert re.search(r"success \(greedy, 95% bootstrap CI\): [\d.]+ \[[\d.]+, [\d.]+\] on 3 problems", res.output)
    assert all(m["question"] in res.output for m in MATH) and "expected" in res.output
    assert (folder / "export" / f"{folder.name}.csv").is_file() and f"teamrl runs export {folder.name}" in res.output

    # the same command again: another folder, the first one as it was
    first = tree_digest(folder)
    res = eval_cli(root, "mine", "--problems", str(problems), "--iteration", "0")
    assert res.exit_code == 0, res.output
    second = only_new(root, before | {folder.name})
    assert runs.read_run_config(second)["source"]["versions"] == dict.fromkeys(AGENTS, 0)
    assert tree_digest(folder) == first and tree_digest(source) == digest

    # the folder itself evaluates again from its finished partition; a changed file is refused
    res = eval_cli(root, folder.name)
    assert res.exit_code == 0 and "mine.jsonl" in res.output and MATH[0]["question"] in res.output, res.output
    jsonl(problems, MATH[:2])
    res = eval_cli(root, folder.name)
    assert res.exit_code == 2 and f"{problems} changed since" in res.output, res.output


@pytest.mark.slow
def test_deepresearch_team_searches_your_documents(prefect_harness, untrained, tmp_path):
    before = {p.name for p in untrained.iterdir()}
    res = eval_cli(
        untrained,
        "dr",
        "--problems",
        str(jsonl(tmp_path / "q.jsonl", QUESTIONS)),
        "--docs",
        str(jsonl(tmp_path / "d.jsonl", DOCS)),
    )
    assert res.exit_code == 0, res.output
    folder = only_new(untrained, before)
    eps = store.read_table(folder, "episodes", 0, "eval").sort_values("episode_id")
    assert eps["answer"].tolist() == ["Mira Dask", "1712"]
    acts = store.read_table(folder, "actions", 0, "eval")
    searched = acts[acts["tool_name"] == "search"]["tool_output"].dropna()
    titles = {d["title"] for d in DOCS}
    assert all(out == "(no results)" or set(re.findall(r"^# (.+)$", out, re.M)) <= titles for out in searched)
    assert "on 2 problems" in res.output


@pytest.mark.slow
def test_dsbench_team_works_on_your_csv_tasks(prefect_harness, untrained, tmp_path):
    csv_files(tmp_path)
    before = {p.name for p in untrained.iterdir()}
    res = eval_cli(untrained, "ds", "--problems", str(jsonl(tmp_path / "t.jsonl", TASKS)))
    assert res.exit_code == 0, res.output
    eps = store.read_table(only_new(untrained, before), "episodes", 0, "eval").sort_values("episode_id")
    assert eps["task_id"].str.startswith(("houses-", "flowers-")).all() and len(eps) == 2
    assert eps["answer"].tolist() == ["RMSE at most 2.5", "macro F1 above the majority-class baseline"]
    assert "RMSE at most 2.5" in res.output and "on 2 problems" in res.output
