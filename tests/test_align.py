"""Stage-0 alignment (tasks/align.py, flows/align.py): the reverse-KL formula against hand-computed values,
the optimisation loop on a toy model, clear errors, and the tiny preset through the real flows."""

import json
import math
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_config

from tasks.align import Probe, align_weights, probe_kl, reverse_kl, tempered_logprobs

LN2, LN3 = math.log(2), math.log(3)


def test_reverse_kl_hand_computed():
    # T = 2 halves the logits: [2 ln2, 0, 0] / 2 -> softmax [1/2, 1/4, 1/4]; [0, 2 ln2, 0] / 2 -> [1/4, 1/2, 1/4]
    new = tempered_logprobs(torch.tensor([[2 * LN2, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), temperature=2.0)
    old = tempered_logprobs(torch.tensor([[0.0, 2 * LN2, 0.0], [0.0, 0.0, 0.0], [2 * LN2, 0.0, 0.0]]), temperature=2.0)
    torch.testing.assert_close(new[0].exp(), torch.tensor([0.5, 0.25, 0.25]))
    kl = reverse_kl(new, old)
    # 1/2 ln(1/2 / 1/4) + 1/4 ln(1/4 / 1/2) + 0 = ln2 / 4;  equal distributions: 0;
    # uniform vs [1/2, 1/4, 1/4]: 1/3 (ln(2/3) + 2 ln(4/3)) = 5/3 ln2 - ln3 (and not the forward KL, 1/2 ln(3/2) + ...)
    torch.testing.assert_close(kl, torch.tensor([LN2 / 4, 0.0, 5 / 3 * LN2 - LN3]))
    forward = (old.exp() * (old - new)).sum(-1)
    assert forward[2].item() == pytest.approx(0.5 * math.log(1.5) + 0.5 * math.log(0.75))
    assert forward[2].item() != pytest.approx(kl[2].item())


class Bigram(torch.nn.Module):
    """A toy causal LM: the logits of the next token are a learnt row per current token."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(self, input_ids, attention_mask, position_ids, logits_to_keep):
        return SimpleNamespace(logits=self.table[input_ids][:, -logits_to_keep:])


# Next-token logits (T = 2): after token 1 -> [1/2, 1/4, 1/4], after token 2 -> uniform.
TABLE = torch.tensor([[0.0, 0.0, 0.0], [2 * LN2, 0.0, 0.0], [0.0, 0.0, 0.0]])
# Two actions: prompt [1] answered [2, 1] (positions after 1 and after 2), prompt [2] answered [1] (after 2).
PROBE = [Probe([1], [2, 1]), Probe([2], [1])]
P_OLD = {"a": torch.tensor([0.25, 0.5, 0.25]), "u": torch.full((3,), 1 / 3), "b": torch.tensor([0.5, 0.25, 0.25])}
TARGETS = [torch.stack([P_OLD["a"], P_OLD["u"]]).log(), P_OLD["b"].log()[None]]


@pytest.mark.parametrize("micro", [1, 2])
def test_probe_kl_is_the_token_mean_over_the_probe_set(micro):
    # [1/2,1/4,1/4] vs [1/4,1/2,1/4] = ln2/4; uniform vs uniform = 0; uniform vs [1/2,1/4,1/4] = 5/3 ln2 - ln3
    expected = (LN2 / 4 + 0.0 + (5 / 3 * LN2 - LN3)) / 3  # a mean over the 3 tokens, not over the 2 actions
    kl = probe_kl(Bigram(TABLE), PROBE, TARGETS, pad_id=0, temperature=2.0, micro_batch_size=micro, backward=False)
    assert kl == pytest.approx(expected, rel=1e-6)


def _toy_policy():
    model = Bigram(TABLE)

    @contextmanager
    def acting(agent):
        yield model

    return SimpleNamespace(
        acting=acting, parameters=lambda agent: [model.table], tokenizer=SimpleNamespace(pad_token_id=0)
    )


def test_align_weights_stops_once_within_delta0():
    policy = _toy_policy()
    kl0 = probe_kl(Bigram(TABLE), PROBE, TARGETS, 0, 2.0, 2, backward=False)
    # (not to 0: after token 2 the targets are both uniform and [1/2, 1/4, 1/4])
    res = align_weights(policy, "a", PROBE, TARGETS, delta0=kl0 / 4, max_steps=200, lr=0.1, temperature=2.0)
    assert res.kl_before == pytest.approx(kl0) and res.converged and 0 < res.steps < 200
    assert res.kl_after <= kl0 / 4
    with policy.acting("a") as model:  # the KL it reports is that of the weights it leaves
        assert probe_kl(model, PROBE, TARGETS, 0, 2.0, 2, backward=False) == pytest.approx(res.kl_after)
    # max_steps=0 only measures
    res0 = align_weights(_toy_policy(), "a", PROBE, TARGETS, delta0=1e-9, max_steps=0, lr=0.1, temperature=2.0)
    assert res0.steps == 0 and not res0.converged and res0.kl_before == res0.kl_after == pytest.approx(kl0)


@pytest.fixture
def untrained_run(tmp_path):
    """A run folder with its config and no training yet (no flow needed to check the refusals)."""
    from infra import runs

    cfg = tiny_config(tmp_path, "run.id=untrained")
    return runs.create_run(tmp_path, "untrained", cfg.model_dump(mode="json"))


@pytest.mark.parametrize(
    "args, words",
    [
        (["--agent", "nobody"], "unknown agent 'nobody'; the team of run 'untrained' is solver, executor, verifier"),
        (["--agent", "executor"], "run 'untrained' has no training rollouts yet"),
        (["--agent", "executor", "--init", "smollm2"], "unsupported init 'smollm2'"),
        (["--agent", "executor", "--delta0", "-1"], "delta0: Input should be greater than 0"),
    ],
)
def test_cli_refuses_what_it_cannot_align(untrained_run, args, words):
    from typer.testing import CliRunner

    from flows.cli import app

    res = CliRunner().invoke(app, ["align", "untrained", "--dir", str(untrained_run.parent), *args])
    assert res.exit_code == 2, res.output
    assert words in " ".join(res.output.split())
    assert not (untrained_run / "checkpoints").exists()


@pytest.mark.slow
def test_swap_then_stage0_alignment_on_the_tiny_preset(prefect_harness, tmp_path):
    """Train 1 iteration, evaluate the team, swap the executor for a fresh agent and align it."""
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from flows.align import align
    from flows.cli import app
    from flows.evaluate import evaluate_partition
    from flows.train import train
    from infra import store
    from infra.policy import latest_version
    from tasks.align import AlignConfig, probe_set, target_logprobs
    from tasks.context import RunContext

    run_dir = Path(
        train(config=tiny_config(tmp_path, "iterations=1", "evaluate=false", "pipeline.eval_size=4", "run.id=swap"))
    )
    rd = str(run_dir)
    with RunContext(rd) as ctx:
        before = evaluate_partition(ctx, 1)  # the team before the swap (the flow uses it, never redoes it)
        # the KL of a fresh executor to the trained one, to set a delta0 that needs a few steps
        policy, temperature = ctx.policy, ctx.config.rollout.temperature
        probe = probe_set(ctx, 1, "executor", 32)
        policy.load(rd, "executor", 1)
        with policy.acting("executor") as m:
            targets = target_logprobs(m, probe, policy.tokenizer.pad_token_id, temperature, 2)
        policy.load(rd, "executor", 0)
        with policy.acting("executor") as m:
            kl0 = probe_kl(m, probe, targets, policy.tokenizer.pad_token_id, temperature, 2, backward=False)
    assert kl0 > 0
    cfg = AlignConfig(agent="executor", delta0=kl0 / 10, max_steps=40)

    r = align(rd, cfg)
    print(
        f"probe {r['probe_actions']} actions / {r['probe_tokens']} tokens; KL {r['kl_before']:.4g} -> "
        f"{r['kl_after']:.4g} in {r['steps']} steps; success before {before['success_rate']:.3f}, swap "
        f"{r['eval']['eval-swap-executor']['success_rate']:.3f}, aligned "
        f"{r['eval']['eval-aligned-executor']['success_rate']:.3f}"
    )
    assert r["kl_before"] == pytest.approx(kl0, rel=1e-4)
    assert r["kl_after"] <= cfg.delta0 < r["kl_before"] and r["converged"] and r["steps"] >= 1
    assert r["eval"]["eval"]["success_rate"] == before["success_rate"]

    # a new checkpoint version with the stage-0 meta; `latest` and the agent's version after iteration 1 moved
    assert latest_version(rd, "executor") == 2 and latest_version(rd, "solver") == 1
    meta = json.loads((run_dir / "checkpoints/executor/v0002/meta.json").read_text())
    assert meta["stage0"] is True and meta["aligned_to"] == 1 and meta["steps"] == r["steps"]
    # (the verifier stays at 0: on the tiny preset it is never scored, so never updated)
    assert store.agent_versions(rd, ["solver", "executor", "verifier"], 1) == {
        "solver": 1,
        "executor": 2,
        "verifier": 0,
    }
    up = store.read_table(rd, "updates", 1, "align")
    assert list(up["strategy"]) == ["stage0"] and int(up["version_after"].iloc[0]) == 2

    # the swap-shock partitions, played by the intended teams, and the record
    eps = store.load_episodes(rd, iteration=1)
    played = {ph: dict(g["policy_versions"].iloc[0]) for ph, g in eps.groupby("phase")}
    assert played["eval"] == {"solver": 1, "executor": 1, "verifier": 0}
    assert played["eval-swap-executor"] == {"solver": 1, "executor": 0, "verifier": 0}
    assert played["eval-aligned-executor"] == {"solver": 1, "executor": 2, "verifier": 0}
    assert (eps[eps.phase != "rollout"].groupby("phase").size() == 4).all()  # 4 held-out problems each
    assert store.partition_exists(rd, "coach", 1, "eval-aligned-executor")
    rec = store.read_table(rd, "align").iloc[0]
    assert rec["agent"] == "executor" and rec["kl_after"] == pytest.approx(r["kl_after"])
    assert rec["success_before"] == before["success_rate"]

    # MLflow: the training run got the alignment's metrics at step 1
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}")
    run = client.get_run((run_dir / "mlflow_run_id").read_text().strip())
    for key in (
        "stage0_kl_before/executor",
        "stage0_kl_after/executor",
        "stage0_steps/executor",
        "eval-swap-executor/success_rate",
        "eval-aligned-executor/success_rate",
    ):
        assert key in run.data.metrics, key
    assert run.data.metrics["stage0_steps/executor"] == r["steps"]

    # the CLI repeats the finished alignment without redoing it, and prints the swap-shock table
    ckpt = run_dir / "checkpoints/executor/v0002/adapter_model.safetensors"
    mtime = ckpt.stat().st_mtime_ns
    runner = CliRunner()
    args = [
        "align",
        "swap",
        "--dir",
        str(tmp_path),
        "--agent",
        "executor",
        "--delta0",
        repr(cfg.delta0),
        "--max-steps",
        "40",
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "eval-swap-executor" in res.output and "stage-0 aligned" in res.output
    assert ckpt.stat().st_mtime_ns == mtime
    res = runner.invoke(app, args[:-1] + ["41"])
    assert res.exit_code == 2
    assert "already aligned at iteration 1 with other options: max_steps=40 (now 41)" in " ".join(res.output.split())
