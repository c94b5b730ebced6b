"""MARS: turn parsing, chat continuation, decoupled-gradient joins, trajectory GRPO, balanced System-1
sampling, and the deepresearch pipeline through the real train flow (tiny model)."""

from dataclasses import replace

import numpy as np
import pytest

from pipelines.deepresearch import DeepResearchConfig
from pipelines.deepresearch.prompts import parse_turn
from pipelines.deepresearch.scoring import exact_match, f1
from pipelines.dual_system.balanced_sampling import balance_system1
from pipelines.dual_system.decoupled import Turn, join_turns
from tasks.advantages import Sample, estimate


def test_parse_turn():
    assert parse_turn("SEARCH: Ilsa Quarn company PURPOSE: who she founded\nmore") == (
        "search",
        "Ilsa Quarn company",
        "who she founded",
    )
    assert parse_turn("I think ANSWER: Dravenport.") == ("answer", "Dravenport.", "")
    assert parse_turn("python: print(3*4) purpose: area") == ("python", "print(3*4)", "area")
    assert parse_turn("SEARCH: only keywords") == ("search", "only keywords", "")
    assert parse_turn("no idea") == ("none", "", "")


def test_answer_scores():
    assert exact_match("The Dravenport!", "dravenport") == 1.0
    assert exact_match("", "") == 0.0
    assert f1("Ilsa Quarn", "Ilsa Marn Quarn") == pytest.approx(2 * 1.0 * (2 / 3) / (1 + 2 / 3))  # P=1, R=2/3
    assert f1("nothing", "Dravenport") == 0.0


def test_config_rejects_half_a_user_corpus():
    with pytest.raises(ValueError, match="give both or neither"):
        DeepResearchConfig(docs_file="docs.jsonl")
    with pytest.raises(ValueError, match="hops"):
        DeepResearchConfig(hops=[5])


def test_continue_chat_keeps_contexts_prefixes_of_each_other():
    from infra.generation import continue_chat, encode_chat
    from infra.models import ModelConfig, load_tokenizer

    tok = load_tokenizer(ModelConfig(name="tiny"))
    p0 = encode_chat(tok, [{"role": "user", "content": "Question: where?"}])
    reply = tok("SEARCH: x PURPOSE: y<|im_end|>", add_special_tokens=False)["input_ids"]
    assert reply[-1] == tok.eos_token_id
    ctx = p0 + reply + continue_chat(tok, reply, "Findings: z")
    whole = encode_chat(
        tok,
        [
            {"role": "user", "content": "Question: where?"},
            {"role": "assistant", "content": "SEARCH: x PURPOSE: y"},
            {"role": "user", "content": "Findings: z"},
        ],
    )
    assert tok.decode(ctx) == tok.decode(whole)  # the same chat as rendering it whole
    cut = reply[:-1]  # a reply cut off by max_new_tokens gets its end-of-turn token added
    assert tok.decode(p0 + cut + continue_chat(tok, cut, "Findings: z")) == tok.decode(whole)


def test_join_turns_masks_observations():
    t1 = Turn([1, 2], [3, 4], [-0.1, -0.2], [0.5, 0.5], [1, 1])
    t2 = Turn([1, 2, 3, 4, 9, 9, 9], [5], [-0.3], [0.5], [1])  # observation 9 9 9 between the turns
    j = join_turns([t1, t2])
    assert j.prompt_ids == [1, 2] and j.response_ids == [3, 4, 9, 9, 9, 5]
    assert j.loss_mask == [1, 1, 0, 0, 0, 1]
    assert j.logprobs == [-0.1, -0.2, 0.0, 0.0, 0.0, -0.3]
    assert j.advantages == [0.5, 0.5, 0.0, 0.0, 0.0, 0.5]
    assert j.ref_logprobs is None  # no reference pass ran
    r1, r2 = replace(t1, ref_logprobs=[-1.0, -2.0]), replace(t2, ref_logprobs=[-3.0])
    assert join_turns([r1, r2]).ref_logprobs == [-1.0, -2.0, 0.0, 0.0, 0.0, -3.0]
    assert join_turns([r1, t2]).ref_logprobs is None
    with pytest.raises(ValueError, match="does not extend"):
        join_turns([t1, Turn([1, 2, 7], [5], [0.0], [0.0], [1])])


def test_grpo_trajectory_counts_each_trajectory_once():
    # group g: episode a (R=1) has 1 System-2 turn and 3 System-1 bins, episode b (R=0) one turn.
    # mean 0.5, std 0.5 -> A_a = +1, A_b = -1, whatever the number of samples per episode.
    def s(ep, agent, r, n=2):
        return Sample(ep, "g", agent, 0, np.zeros(n), np.zeros(n), r)

    samples = [
        s("a", "system2", 1.0),
        s("a", "system1", 1.0),
        s("a", "system1", 1.0),
        s("a", "system1", 1.0),
        s("b", "system2", 0.0),
    ]
    adv = estimate("grpo_trajectory", samples, eps=0.0)
    assert [a[0] for a in adv] == [1.0, 1.0, 1.0, 1.0, -1.0]
    assert all(len(a) == 2 for a in adv)


def _row(ep, system, adv):
    return {"episode_id": ep, "system": system, "advantages": [adv, adv], "weight": 1}


def _systems(rows):
    return [r["system"] for r in rows]


def test_balance_system1_matches_system2_count():
    rng = np.random.default_rng(0)
    rows = [_row(e, 2, 0.0) for e in "abc"] + [_row(e, 1, a) for e, a in zip("aaabbd", [1, 0, 2, 0, 3, 1])]
    rows[2]["weight"] = 0  # an episode without an advantage does not count
    balance_system1(rows, _systems(rows), "advantage", rng)
    s1 = [r["weight"] for r in rows if r["system"] == 1]
    assert sum(s1) == 2 and max(s1) == 1  # two System-2 trajectories -> two System-1 samples
    few = [_row("a", 2, 1.0), _row("b", 2, 1.0), _row("c", 2, 1.0), _row("a", 1, 1.0)]
    balance_system1(few, _systems(few), "advantage", rng)
    assert few[-1]["weight"] == 3  # up-sampled by duplication
    off = [_row("a", 2, 1.0), _row("a", 1, 1.0), _row("a", 1, 1.0)]
    balance_system1(off, _systems(off), "off", rng)
    assert [r["weight"] for r in off] == [1, 1, 1]


@pytest.mark.slow
def test_deepresearch_flow_trains_both_systems(mars_run):
    """One real iteration: System 2 searches with a purpose, System 1 extracts from FFD bins, the model
    both play gets a GRPO update, System-1 samples are balanced to the number of trajectories."""
    from flows.metrics import partition_metrics
    from infra import store

    _, run_dir = mars_run
    acts = store.load_actions(run_dir, 1, "rollout")
    eps = store.read_table(run_dir, "episodes", 1, "rollout")
    s1, s2 = acts[acts["system"] == 1], acts[acts["system"] == 2]
    assert len(s1) and len(s2) and set(acts["agent"]) == {"system1", "system2"}
    assert acts["ref_logprobs"].isna().all()  # kl_coef = 0: no reference pass
    calls = s2[s2["tool_name"] == "search"]
    assert len(calls) == len(eps)  # scaffold: every episode's first turn is a search
    # every System-1 sample points at its System-2 tool call in the same episode
    parents = set(zip(calls["episode_id"], calls["turn"]))
    assert set(zip(s1["episode_id"], s1["parent_turn"])) <= parents
    assert (s1["tool_input"].str.len() > 0).all()  # the purpose (or the query when none was given)
    assert s1["weight"].sum() == eps["episode_id"].nunique()  # balanced to System 2's one sample per trajectory
    m = eps["metrics"].map(dict)
    assert all(x["s1_bins"] >= x["s1_bins_lower_bound"] >= 1 for x in m)
    up = store.read_table(run_dir, "updates").set_index("agent")
    assert set(up.index) == {"shared"}  # one model plays both systems (tests/test_mars_shared.py)
    assert (up["tokens"] > 0).all() and (up["strategy"] == "joint").all()
    pm = partition_metrics(run_dir, 1, "rollout")
    assert {
        "episode/f1",
        "episode/tool_calls",
        "system1/compression",
        "system1/bins_over_lower_bound",
        "episode/s2_context_tokens",
    } <= set(pm)


@pytest.mark.slow
def test_deepresearch_without_system1(prefect_harness, tmp_path):
    """The ablation: one agent, System 2 reads the raw results truncated to its budget."""
    from conftest import MARS

    from flows.config import load_config
    from flows.train import train
    from infra import store

    cfg = load_config("deepresearch-tiny", [f"run.dir={tmp_path}", "run.id=nos1", *MARS, "pipeline.system1=false"])
    run_dir = train(config=cfg)
    acts = store.load_actions(run_dir, 1, "rollout")
    assert set(acts["agent"]) == {"system2"} and (acts["system"] == 2).all()
    assert set(store.read_table(run_dir, "updates")["agent"]) == {"shared"}
    m = store.read_table(run_dir, "episodes", 1, "rollout")["metrics"].map(dict)
    assert all(x["s1_bins"] == 0 and x["s1_tokens_in"] == 0 for x in m) and any(x["tool_calls"] == 1 for x in m)


def test_rubric_blames_the_system_that_failed():
    from pipelines.base import Episode, Problem
    from pipelines.deepresearch.scoring import rubric_scores

    def act(agent, tool_name, out=None, text="", purpose=None):
        return {
            "agent": agent,
            "tool_name": tool_name,
            "tool_output": out,
            "response_text": text,
            "tool_input": purpose,
        }

    doc = "# Marlo Works\nMarlo Works was founded by Ada Vell."
    purpose = "who founded Marlo Works"
    ep = Episode(
        Problem("t", "Who founded Marlo Works?", "Ada Vell"),
        "e",
        "g",
        actions=[
            act("system2", "search", out=doc),
            act("system1", "extract", out=doc, text="Founded by Ada Vell.", purpose=purpose),
            act("system1", "extract", out=doc, text="A bridge.", purpose=purpose),
            act("system1", "extract", out="# Other\nNothing here.", text="NONE", purpose=purpose),
            # naming the question's entity passes nothing on, even where the purpose misspells it; the answer
            # must be whole words
            act("system1", "extract", out=doc, text="Marlo Works was founded.", purpose=purpose),
            act("system1", "extract", out=doc, text="Marlo Works was founded.", purpose="who founded Marlo Werks"),
            act("system1", "extract", out=doc, text="Ada Vellum founded it.", purpose=purpose),
            act("system2", "answer"),
            act("system2", None),
        ],
        final_answer="Ada",
    )
    scores = [s for s, _ in rubric_scores(ep, ["Marlo Works"])]
    assert scores == [10.0, 10.0, 0.0, 5.0, 0.0, 0.0, 0.0, pytest.approx(10 * f1("Ada", "Ada Vell")), 0.0]
    missed = Episode(ep.problem, "e", "g", actions=[act("system2", "search", out="# Other\nNothing.")])
    assert rubric_scores(missed, ["Marlo Works"])[0][0] == 2.0
    ada = "# Ada Vell\nAda Vell was born in Kesh."
    # two hops: from the first document, the next hop's entity (the second support title, which the
    # purpose does not name) is what must be passed on
    hop = Episode(
        Problem("u", "Where was the founder of Marlo Works born?", "Kesh"),
        "e",
        "g",
        actions=[
            act("system1", "extract", out=doc, text="Ada Vell founded it.", purpose=purpose),
            act("system1", "extract", out=doc, text="Marlo Works is old.", purpose=purpose),
            # the second hop: its purpose names the bridge entity, so only the answer counts
            act("system1", "extract", out=ada, text="Ada Vell was a painter.", purpose="where Ada Vell was born"),
            act("system1", "extract", out=ada, text="Ada Vell was born in Kesh.", purpose="where Ada Vell was born"),
        ],
    )
    assert [s for s, _ in rubric_scores(hop, ["Marlo Works", "Ada Vell"])] == [10.0, 0.0, 0.0, 10.0]


def test_system1_coach_credit_replaces_only_system1_advantages():
    """`pipeline.system1_credit=coach`: System 2 keeps its trajectory advantage; each System-1 sample gets
    GRPO over coach / 10 within its question's group (g: 10 and 0 -> +1 and -1; h: 10 and 10 -> 0 and 0);
    an unscored extraction gets none."""
    from functools import partial

    from pipelines.base import CreditBatch
    from pipelines.dual_system import system1_coach_credit

    def s(ep, group, agent, r):
        return Sample(ep, group, agent, 0, np.zeros(2), None, r)

    recs = [
        {"system": 2, "score": 3.0},
        {"system": 1, "score": 10.0},
        {"system": 2, "score": 7.0},
        {"system": 1, "score": 0.0},
        {"system": 1, "score": 10.0},
        {"system": 1, "score": 10.0},
        {"system": 1, "score": None},
    ]
    samples = [
        s("a", "g", "system2", 1.0),
        s("a", "g", "system1", 1.0),
        s("b", "g", "system2", 0.0),
        s("b", "g", "system1", 0.0),
        s("c", "h", "system1", 1.0),
        s("d", "h", "system1", 0.0),
        s("d", "h", "system1", 0.0),
    ]
    advs = estimate("grpo_trajectory", samples, eps=0.0)
    raws = estimate("grpo_trajectory", samples, eps=0.0, scale=False)
    system1_coach_credit(CreditBatch(recs, samples, advs, raws, True, partial(estimate, eps=1e-9)))
    assert advs[-1] is None and raws[-1] is None
    assert [a[0] for a in advs[:-1]] == pytest.approx([1.0, 1.0, -1.0, -1.0, 0.0, 0.0])
    assert [a[0] for a in raws[:-1]] == pytest.approx([0.5, 0.5, -0.5, -0.5, 0.0, 0.0])
    assert [x.score for x in samples] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, None]


def test_positive_only_zeroes_negative_advantages_token_by_token():
    """`algorithm.positive_only`: A' = max(A, 0) per token; an action without an advantage keeps none."""
    from tasks.compute_advantages import positive_part

    out = positive_part([np.array([1.5, -0.5, 0.0]), None, np.array([-2.0])])
    assert out[1] is None
    assert out[0].tolist() == [1.5, 0.0, 0.0] and out[2].tolist() == [0.0]


def test_advantage_rows_train_only_positive_advantages_when_asked(monkeypatch):
    """A GRPO group of rewards 1, 0, 0, 1/2 (mean 3/8, std sqrt(11/64)): with `positive_only` the trained
    advantages are (5/8) / std, 0, 0, (1/8) / std while `raw_advantages` keeps 5/8, -3/8, -3/8, 1/8."""
    from types import SimpleNamespace

    import pandas as pd

    from pipelines.base import PipelineBase
    from tasks import compute_advantages as ca
    from tasks.algorithm import AlgorithmConfig

    rewards = [1.0, 0.0, 0.0, 0.5]
    acts = pd.DataFrame(
        {
            "run_id": "r",
            "iteration": 1,
            "phase": "rollout",
            "episode_id": list("abcd"),
            "turn": 0,
            "agent": "system2",
            "system": 2,
            "score": np.nan,
            "error_kind": "",
            "ref_logprobs": None,
            "logprobs": [[-1.0, -1.0]] * 4,
            "response_ids": [[1, 2]] * 4,
        }
    )
    eps = pd.DataFrame({"episode_id": list("abcd"), "outcome": rewards, "group_id": "g"})
    for positive_only in (False, True):
        algo = AlgorithmConfig(estimator="grpo_trajectory", kl_coef=0.0, positive_only=positive_only, whiten_eps=1e-12)
        run = SimpleNamespace(
            run_dir="run", config=SimpleNamespace(algorithm=algo), seed_for=lambda *p: 0, pipeline=PipelineBase()
        )
        monkeypatch.setattr(ca.store, "load_actions", lambda *_a: acts)
        monkeypatch.setattr(ca.store, "read_table", lambda *_a: eps)
        rows = ca.advantage_rows(run, 1, "rollout")
        std, raw = np.sqrt(11 / 64), [5 / 8, -3 / 8, -3 / 8, 1 / 8]
        want = [max(r, 0.0) if positive_only else r for r in raw]
        assert np.allclose([r["advantages"] for r in rows], [[w / std] * 2 for w in want], rtol=1e-5)
        assert np.allclose([r["raw_advantages"] for r in rows], [[r] * 2 for r in raw], rtol=1e-5)


def test_system1_coach_credit_needs_a_coach_and_a_trajectory_estimator():
    from flows.config import load_config
    from tasks.config import ConfigError

    load_config("deepresearch-tiny", ["pipeline.system1_credit=coach", "coach.backend=rubric"])
    with pytest.raises(ConfigError, match="coach.backend rubric or llm"):
        load_config("deepresearch-tiny", ["pipeline.system1_credit=coach"])
    with pytest.raises(ConfigError, match="got grpo,"):
        load_config(
            "deepresearch-tiny", ["pipeline.system1_credit=coach", "coach.backend=rubric", "algorithm.estimator=grpo"]
        )


def test_dual_system_knobs_saved_under_algorithm_still_load():
    """A config saved when `balance` and `system1_credit` were `algorithm` keys: a dual-system pipeline gets
    them as its own (unless it sets them), any other pipeline drops them (it never used them)."""
    from tasks.config import RunConfig, validate

    old = {"balance": "uniform", "system1_credit": "coach", "estimator": "grpo_trajectory", "kl_coef": 0.0}
    cfg = validate({"pipeline": {"name": "deepresearch"}, "coach": {"backend": "rubric"}, "algorithm": old}, RunConfig)
    assert (cfg.pipeline.balance, cfg.pipeline.system1_credit) == ("uniform", "coach")
    mine = {"name": "deepresearch", "balance": "off"}
    assert validate({"pipeline": mine, "algorithm": {"balance": "uniform"}}, RunConfig).pipeline.balance == "off"
    math = validate({"algorithm": {"balance": "advantage", "system1_credit": "trajectory"}}, RunConfig)
    assert "balance" not in math.algorithm.model_dump() and not hasattr(math.pipeline, "balance")


@pytest.mark.slow
def test_system1_coach_credit_and_kl_loss_flow(prefect_harness, tmp_path):
    """One real iteration with the rubric coach crediting System 1's extractions and a KL term in the loss:
    System-1 rewards are their coach scores / 10, System 2's the trajectory's outcome, every training
    action has reference log-probs, and the update trains on both systems."""
    from conftest import MARS

    from flows.config import load_config
    from flows.train import train
    from infra import store

    over = ["pipeline.system1_credit=coach", "coach.backend=rubric", "algorithm.kl_loss_coef=0.05"]
    cfg = load_config("deepresearch-tiny", [f"run.dir={tmp_path}", "run.id=s1coach", *MARS, *over])
    run_dir = train(config=cfg)
    adv = store.read_table(run_dir, "advantages", 1, "rollout")
    coach = store.read_table(run_dir, "coach", 1, "rollout")
    eps = store.read_table(run_dir, "episodes", 1, "rollout").set_index("episode_id")
    both = adv.merge(coach, on=["episode_id", "agent", "turn"])
    s1, s2 = both[both["agent"] == "system1"], both[both["agent"] == "system2"]
    assert len(s1) and len(s2)
    assert np.allclose(s1["reward"], s1["score"] / 10)
    assert np.allclose(s2["reward"], eps.loc[s2["episode_id"], "outcome"])
    acts = store.load_actions(run_dir, 1, "rollout")
    assert acts["ref_logprobs"].notna().all()
    assert all(len(r) == len(x) for r, x in zip(acts["ref_logprobs"], acts["logprobs"]))
    up = store.read_table(run_dir, "updates")
    assert up["tokens"].gt(0).all() and up["kl_ref"].ge(0).all()
