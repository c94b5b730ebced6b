"""Inspection of a real tiny run: the flat action table, JSONL / CSV export, transcripts, and the CLI."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from flows.inspection import TOKEN_COLUMNS, episode_table, export, transcript
from infra import store
from infra.store import KEYS

pytestmark = pytest.mark.slow

EPISODE_FIELDS = ["question", "answer", "final_answer", "outcome", "success", "num_turns", "pipeline"]


@pytest.fixture
def run_copy(trained_run, tmp_path):
    """The shared trained run's tables and config copied (no checkpoints), so a test may write into it."""
    _, run_dir = trained_run
    dst = tmp_path / "runs" / Path(run_dir).name
    shutil.copytree(run_dir, dst, ignore=shutil.ignore_patterns("checkpoints"))
    return dst


def latest_rollout_episode(run_dir):
    eps = store.load_episodes(run_dir, phase="rollout")
    last = eps[eps["iteration"] == eps["iteration"].max()].sort_values("episode_id")
    return last.iloc[0]


def test_episode_table_is_one_row_per_action_with_episode_and_coach(trained_run):
    _, run_dir = trained_run
    actions = store.read_table(run_dir, "actions")
    df = episode_table(run_dir)
    assert len(df) == len(actions)
    assert not df.duplicated(KEYS).any()
    for col in (
        KEYS
        + EPISODE_FIELDS
        + [
            "response_text",
            "tool_input",
            "tool_output",
            "score",
            "rationale",
            "response_tokens",
            "metrics.greedy",
            "policy_versions.solver",
        ]
    ):
        assert col in df.columns, col
    assert not set(TOKEN_COLUMNS) & set(df.columns)
    assert df["question"].notna().all() and (df["question"] != "").all()
    coach = store.read_table(run_dir, "coach")
    joined = df.merge(coach[KEYS + ["score"]], on=KEYS, suffixes=("", "_coach"))
    assert len(joined) == len(df)
    # an unscored action (None, status `skipped`) stays unscored
    assert joined["score"].astype(float).fillna(-1).equals(joined["score_coach"].astype(float).fillna(-1))
    eps = store.load_episodes(run_dir).set_index(["iteration", "phase", "episode_id"])
    for r in df.sample(5, random_state=0).itertuples():
        assert bool(eps.loc[(r.iteration, r.phase, r.episode_id), "success"]) == bool(r.success)
    lengths = store.load_actions(run_dir)["response_ids"].map(len)
    assert sorted(df["response_tokens"].astype(int)) == sorted(lengths)

    with_tokens = episode_table(run_dir, tokens=True)
    assert set(TOKEN_COLUMNS) <= set(with_tokens.columns) and len(with_tokens) == len(df)
    per_iteration = df.groupby(["iteration", "agent"])[["score", "success"]].mean()
    assert len(per_iteration) == df[["iteration", "agent"]].drop_duplicates().shape[0]


def test_export_jsonl_round_trip(trained_run, tmp_path):
    _, run_dir = trained_run
    n_actions = len(store.read_table(run_dir, "actions"))
    path, rows = export(run_dir, "jsonl", tmp_path / "run.jsonl")
    assert path == tmp_path / "run.jsonl" and rows == n_actions
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == n_actions
    assert all(not set(TOKEN_COLUMNS) & set(r) for r in records)
    back = pd.read_json(path, lines=True)
    assert len(back) == n_actions
    assert {"episode_id", "turn", "agent", "question", "score", "rationale", "success"} <= set(back.columns)
    table = episode_table(run_dir)
    assert sorted(zip(back["iteration"], back["phase"], back["episode_id"], back["turn"])) == sorted(
        zip(table["iteration"], table["phase"], table["episode_id"], table["turn"])
    )

    path, _ = export(run_dir, "jsonl", tmp_path / "tokens.jsonl", tokens=True)
    first = json.loads(path.read_text().splitlines()[0])
    actions = store.load_actions(run_dir)
    row = actions[
        (actions["iteration"] == first["iteration"])
        & (actions["phase"] == first["phase"])
        & (actions["episode_id"] == first["episode_id"])
        & (actions["turn"] == first["turn"])
    ].iloc[0]
    assert first["response_ids"] == list(row["response_ids"])
    assert len(first["logprobs"]) == len(first["response_ids"])


def test_export_csv_round_trip(trained_run, tmp_path):
    _, run_dir = trained_run
    n_actions = len(store.read_table(run_dir, "actions"))
    path, rows = export(run_dir, "csv", tmp_path / "run.csv")
    back = pd.read_csv(path)
    assert rows == len(back) == n_actions
    assert {"episode_id", "turn", "agent", "question", "answer", "score", "rationale", "success"} <= set(back.columns)
    assert not set(TOKEN_COLUMNS) & set(back.columns)
    assert back["score"].dropna().between(0, 10).all() and back["score"].notna().any()

    path, _ = export(run_dir, "CSV", tmp_path / "tokens.csv", tokens=True)
    back = pd.read_csv(path)
    ids = back["response_ids"].map(json.loads)
    assert (ids.map(len) == back["response_tokens"]).all()


def test_export_refuses_to_overwrite(trained_run, tmp_path):
    _, run_dir = trained_run
    out = tmp_path / "run.csv"
    out.write_text("keep me\n")
    with pytest.raises(FileExistsError, match="already exists"):
        export(run_dir, "csv", out)
    assert out.read_text() == "keep me\n"
    path, rows = export(run_dir, "csv", out, overwrite=True)
    assert len(pd.read_csv(path)) == rows
    assert [p.name for p in tmp_path.iterdir()] == ["run.csv"]  # no temporary file left behind


def test_export_bad_format(trained_run, tmp_path):
    _, run_dir = trained_run
    with pytest.raises(ValueError, match="jsonl, csv"):
        export(run_dir, "parquet", tmp_path / "run.parquet")
    assert not list(tmp_path.iterdir())


def test_transcript_shows_question_turns_coach_and_result(trained_run):
    _, run_dir = trained_run
    ep = latest_rollout_episode(run_dir)
    text = transcript(run_dir, ep["episode_id"], max_chars=None)
    assert f"iteration {ep['iteration']}, phase rollout" in text
    assert ep["question"] in text
    acts = store.load_actions(run_dir, int(ep["iteration"]), "rollout")
    acts = acts[acts["episode_id"] == ep["episode_id"]].sort_values("turn")
    assert len(acts) == ep["num_turns"] and set(acts["agent"]) == {"solver", "executor", "verifier"}
    positions = []
    for a in acts.itertuples():
        heading = f"## Turn {a.turn}: {a.agent} "
        assert heading in text
        positions.append(text.index(heading))
        section = text[positions[-1] :]
        verdict = f"{float(a.score):g} (rubric)" if a.status == "ok" else "- (rubric), status skipped"  # unscored
        assert f"coach score {verdict}: {a.rationale.strip()}" in section
        if a.response_text.strip():
            assert a.response_text.strip()[:40] in section
    assert positions == sorted(positions)
    assert text.index(ep["question"]) < positions[0] < text.index("## Result")
    assert f"expected answer: {ep['answer']}" in text
    assert f"success: {'yes' if ep['success'] else 'no'}" in text
    assert "tool python" in text  # the executor's code call


def test_transcript_picks_iterations_and_cuts_long_texts(trained_run):
    _, run_dir = trained_run
    ep = latest_rollout_episode(run_dir)
    latest = transcript(run_dir, ep["episode_id"])
    assert "also occurs at iteration 1" in latest
    first = transcript(run_dir, ep["episode_id"], iteration=1)
    assert "iteration 1, phase rollout" in first and "also occurs at iteration 2" in first
    short = transcript(run_dir, ep["episode_id"], max_chars=5)
    assert "more characters]" in short


def test_transcript_unknown_episode(trained_run):
    _, run_dir = trained_run
    ids = set(store.load_episodes(run_dir)["episode_id"])
    with pytest.raises(ValueError, match="no episode 'nope'") as e:
        transcript(run_dir, "nope")
    listed = str(e.value).split("ids in this run: ", 1)[1]
    assert any(i in listed for i in ids)
    with pytest.raises(ValueError, match="it is at iteration 1 phase rollout"):
        transcript(run_dir, latest_rollout_episode(run_dir)["episode_id"], iteration=0)


def test_cli_export_and_show(run_copy):
    from typer.testing import CliRunner

    from flows.cli import app

    runner = CliRunner()
    runs_dir, run_id = str(run_copy.parent), run_copy.name
    n_actions = len(store.read_table(run_copy, "actions"))

    res = runner.invoke(app, ["runs", "export", run_id, "--format", "jsonl", "--dir", runs_dir])
    assert res.exit_code == 0, res.output
    default = run_copy / "export" / f"{run_id}.jsonl"
    assert f"exported {n_actions} actions" in res.output and str(default) in res.output.replace("\n", "")
    assert len(default.read_text().splitlines()) == n_actions
    assert "response_ids" not in json.loads(default.read_text().splitlines()[0])

    res = runner.invoke(app, ["runs", "export", run_id, "--format", "jsonl", "--dir", runs_dir])
    assert res.exit_code == 2 and "already exists" in res.output
    res = runner.invoke(
        app, ["runs", "export", run_id, "--format", "jsonl", "--dir", runs_dir, "--tokens", "--overwrite"]
    )
    assert res.exit_code == 0, res.output
    assert "response_ids" in json.loads(default.read_text().splitlines()[0])

    out = run_copy.parent / "flat.csv"
    res = runner.invoke(app, ["runs", "export", run_id, "--format", "csv", "--out", str(out), "--dir", runs_dir])
    assert res.exit_code == 0, res.output
    assert len(pd.read_csv(out)) == n_actions
    res = runner.invoke(app, ["runs", "export", run_id, "--format", "xml", "--dir", runs_dir])
    assert res.exit_code == 2 and "unknown --format 'xml'" in res.output and "jsonl, csv" in res.output
    res = runner.invoke(app, ["runs", "export", "nope", "--dir", runs_dir])
    assert res.exit_code == 2 and "no run 'nope'" in res.output

    res = runner.invoke(app, ["runs", "show", run_id, "--dir", runs_dir])
    assert res.exit_code == 0, res.output
    assert "rollout" in res.output and "--episode" in res.output and "rollout-0000-00" in res.output

    ep_id = latest_rollout_episode(run_copy)["episode_id"]
    eps = store.load_episodes(run_copy, 1, "rollout")
    ep = eps[eps["episode_id"] == ep_id].iloc[0]
    res = runner.invoke(app, ["runs", "show", run_id, "--dir", runs_dir, "--episode", ep_id, "--iteration", "1"])
    assert res.exit_code == 0, res.output
    assert ep["question"] in res.output and "iteration 1, phase rollout" in res.output
    assert all(f": {a} (policy" in res.output for a in ("solver", "executor", "verifier"))
    assert "coach score" in res.output and "## Result" in res.output
    res = runner.invoke(app, ["runs", "show", run_id, "--dir", runs_dir, "--episode", "nope"])
    assert res.exit_code == 2 and "no episode 'nope'" in res.output


def test_transcript_asks_for_the_phase_when_an_iteration_has_the_id_twice(run_copy):
    """Held-out swap-shock partitions (flows/align.py) reuse the eval episode ids at the same iteration."""
    for table in ("episodes", "actions", "coach"):
        rows = store.read_table(run_copy, table, 2, "eval").to_dict("records")
        store.write_partition(run_copy, table, 2, "eval-swap-solver", rows)
    with pytest.raises(ValueError, match=r"several phases of iteration 2 \(eval, eval-swap-solver\)"):
        transcript(run_copy, "eval-0000-00")
    text = transcript(run_copy, "eval-0000-00", phase="eval-swap-solver")
    assert "iteration 2, phase eval-swap-solver" in text and "also occurs at iteration 0" in text


def test_size_text_picks_the_largest_unit_below_1024():
    from flows.inspection import size_text

    assert [size_text(n) for n in (0, 1023, 1024, 3500, 12 * 1024**2, 5000 * 1024**4)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "3.4 KiB",
        "12.0 MiB",
        "5000.0 TiB",
    ]
