"""Engines behind one interface, checked on a CPU: the registry, that the CPU install never imports vllm
or deepspeed, the `hf` engine and rescoring, the coach's client pool and the GPU preset's checks. The
vLLM engine: tests/test_vllm_engine.py; the DeepSpeed trainer: tests/test_deepspeed_trainer.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from infra.engines import EngineUnavailable, engine_class, known
from infra.engines.pool import ClientPool
from infra.engines.types import GenerationRequest

ROOT = Path(__file__).resolve().parents[1]


# -- the registry ----------------------------------------------------------------------------------
def test_registry_resolves_the_cpu_engines_by_name():
    from infra.engines.hf import HFGeneration
    from infra.engines.torch import TorchTrainer

    assert engine_class("generation", "hf") is HFGeneration
    assert engine_class("trainer", "torch") is TorchTrainer
    assert known("generation") == ["hf", "vllm"] and known("trainer") == ["deepspeed", "torch"]


def test_the_config_schema_offers_the_built_in_engines_and_refuses_no_plugin_one():
    from infra.engines.config import EnginesConfig

    props = EnginesConfig.model_json_schema()["properties"]
    for kind, names in (("generation", ["hf", "vllm"]), ("trainer", ["torch", "deepspeed"])):
        assert props[kind]["type"] == "string" and props[kind]["examples"] == names and "enum" not in props[kind]


def test_unknown_engine_names_the_known_ones():
    with pytest.raises(EngineUnavailable, match=r"unknown generation engine 'sglang'; known: hf, vllm"):
        engine_class("generation", "sglang")
    with pytest.raises(EngineUnavailable, match=r"unknown trainer engine 'fsdp'; known: deepspeed, torch"):
        engine_class("trainer", "fsdp")
    with pytest.raises(EngineUnavailable, match="kinds: generation, trainer"):
        engine_class("coach", "x")


@pytest.mark.parametrize("kind,name,package", [("generation", "vllm", "vllm"), ("trainer", "deepspeed", "deepspeed")])
def test_a_gpu_engine_without_its_library_names_the_extra(monkeypatch, kind, name, package):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == package else real(n, *a))
    with pytest.raises(EngineUnavailable, match=rf"needs {package}, which is not installed.*pip install -e \.\[gpu\]"):
        engine_class(kind, name)


def test_a_run_whose_engine_is_not_installed_is_refused_before_it_starts(prefect_harness, monkeypatch, tmp_path):
    """`teamrl train` with engines.generation=vllm where vLLM is missing: one line naming the extra, exit
    status 2, no traceback, and no run folder made (nothing was loaded or written)."""
    import importlib.util

    from typer.testing import CliRunner

    from flows.cli import app

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    monkeypatch.setenv("COLUMNS", "1000")
    args = ["train", "mathchat-smol", "--set", f"run.dir={tmp_path}", "--set", "engines.generation=vllm"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert "needs vllm, which is not installed" in line and "pip install -e .[gpu]" in line, line
    assert "Traceback" not in res.output
    assert not [p for p in tmp_path.iterdir() if p.is_dir()], list(tmp_path.iterdir())


def test_the_cpu_install_never_imports_vllm_or_deepspeed(tmp_path):
    """Fake `vllm` and `deepspeed` packages first on the path record any import; the whole package is imported,
    the run config with GPU engines validated, and the CPU engines built by name."""
    for name in ("vllm", "deepspeed"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"open({str(tmp_path / 'imported')!r}, 'a').write('{name}\\n')\nraise ImportError('fake {name}')\n"
        )
    code = """
import sys
import flows.cli, flows.train, flows.evaluate, flows.align, flows.deployments
import tasks.update, tasks.collect_rollouts, tasks.coach_evaluate, tasks.context
import infra.engines.hf, infra.engines.torch, infra.engines.vllm, infra.engines.deepspeed, infra.engines.zero
from infra.engines import engine_class
from flows.config import load_config
engine_class("generation", "hf"); engine_class("trainer", "torch")
engine_class("generation", "vllm"); engine_class("trainer", "deepspeed")  # found (the fakes), not imported
cfg = load_config("mathchat-gpu", [])
assert cfg.engines.generation == "vllm" and cfg.engines.trainer == "deepspeed"
print(sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "deepspeed")))
"""
    env = os.environ | {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "HF_HUB_OFFLINE": "1", "TEAMRL_PROGRESS": "0"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert not (tmp_path / "imported").exists(), (tmp_path / "imported").read_text()


# -- the hf engine and rescoring -------------------------------------------------------------------------
@pytest.mark.parametrize("fold", [True, False])
def test_hf_engine_is_the_generate_it_wraps(policy, fold):
    import torch

    from infra.engines.config import EnginesConfig
    from infra.engines.hf import HFGeneration
    from infra.generation import generate

    prompts = [[1, 5, 9, 12], [1, 7]]
    torch.manual_seed(11)
    with (policy.sampling if fold else policy.acting)("a") as m:
        direct = generate(m, policy.tokenizer, prompts, 6, temperature=0.8, batch_size=4)
    eng = HFGeneration(policy, None, EnginesConfig(batch_size=4, fold_adapter=fold), ["a", "b"], 0)
    assert eng.weights == (policy.sampling if fold else policy.acting)
    via = eng.generate(GenerationRequest("a", prompts, 6, temperature=0.8, seed=11))
    assert [g.response_ids for g in via] == [g.response_ids for g in direct]
    assert [g.logprobs for g in via] == [g.logprobs for g in direct]


def test_sampling_folds_the_adapter_in_and_gives_the_base_back_bit_exact(policy, tmp_path):
    """`sampling` runs agent b's adapter folded into the base weights (W + s * B @ A): the same logits as
    the adapter computed on the side, another weight tensor in the block, and after it the very tensors
    and bits of the base, every adapter still trainable."""
    import torch

    from infra.generation import generate

    with torch.no_grad():
        for p in policy.parameters("b"):
            p.add_(0.05 * torch.randn_like(p))  # a trained adapter (B != 0)
    base = {n: (p.data_ptr(), p.detach().clone()) for n, p in policy.model.named_parameters() if "base_layer" in n}
    ids = torch.tensor([[1, 5, 9, 12, 3]])
    try:
        with torch.no_grad(), policy.acting("b") as m:
            want = m(input_ids=ids).logits
        with torch.no_grad(), policy.sampling("b") as m:
            got = m(input_ids=ids).logits
            assert any(not torch.equal(p, base[n][1]) for n, p in policy.model.named_parameters() if n in base)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        for n, p in policy.model.named_parameters():
            if n in base:
                assert p.data_ptr() == base[n][0] and torch.equal(p, base[n][1])
        prompts = [[1, 5, 9, 12], [1, 7]]
        gens = []
        for ctx in (policy.acting, policy.sampling):
            torch.manual_seed(3)
            with ctx("b") as m:
                gens.append(generate(m, policy.tokenizer, prompts, 6, temperature=0.8, batch_size=4))
        for a, b in zip(*gens):
            assert a.response_ids == b.response_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        with policy.acting("a"):
            assert all(p.requires_grad for agent in ("a", "b") for p in policy.parameters(agent))
    finally:
        policy.load(tmp_path, "b", 0)  # the fixture's initial adapter


def test_sampling_folds_a_float32_adapter_into_a_bfloat16_base():
    """The GPU presets run a bfloat16 base, and peft keeps each adapter in float32: folding casts the
    adapter to the base's dtype (a mixed-dtype addmm fails), and the folded logits match the adapter on
    the side within bfloat16's rounding."""
    import torch

    from infra.models import ModelConfig
    from infra.policy import TeamPolicy

    policy = TeamPolicy(ModelConfig(name="tiny", dtype="bfloat16", lora_rank=4, lora_alpha=8), ["a"])
    assert {p.dtype for p in policy.parameters("a")} == {torch.float32} and policy._foldable("a")
    with torch.no_grad():
        for p in policy.parameters("a"):
            p.add_(0.05 * torch.randn_like(p))
    ids = torch.tensor([[1, 5, 9, 12, 3]])
    with torch.no_grad(), policy.acting("a") as m:
        want = m(input_ids=ids).logits.float()
    with torch.no_grad(), policy.sampling("a") as m:
        got = m(input_ids=ids).logits.float()
    assert (got - want).abs().max() <= 0.05 * want.abs().max()


def test_sampling_does_not_fold_partitioned_weights(policy, monkeypatch):
    """Under a trainer that partitions weights (ZeRO-3 sets `gather`) the base is not whole: `sampling`
    is `acting`, the adapter on the side."""
    from contextlib import nullcontext

    monkeypatch.setattr(policy, "gather", lambda params, modify: nullcontext())
    before = {n: p.data_ptr() for n, p in policy.model.named_parameters() if "base_layer" in n}
    with policy.sampling("a"):
        assert all(p.data_ptr() == before[n] for n, p in policy.model.named_parameters() if n in before)


def test_sampling_does_not_fold_into_a_tied_head():
    """With the LM head adapted and tied to the input embeddings (the tiny model ties them), folding the
    head's adapter would change the embeddings too: `sampling` leaves every adapter beside its layer."""
    from infra.models import ModelConfig
    from infra.policy import TeamPolicy

    tied = TeamPolicy(ModelConfig(name="tiny", lora_rank=4, lora_alpha=8, lora_targets=["q_proj", "lm_head"]), ["a"])
    assert tied.model.get_output_embeddings().base_layer.weight is tied.model.get_input_embeddings().weight
    assert tied._foldable("a") == []
    untied = TeamPolicy(ModelConfig(name="tiny", lora_rank=4, lora_alpha=8, lora_targets=["q_proj"]), ["a"])
    assert len(untied._foldable("a")) == 4  # q_proj of each of the tiny model's 4 layers


@pytest.mark.parametrize("greedy", [False, True])
def test_sampler_draws_from_softmax_over_temperature_and_records_the_logprob(greedy):
    """The Sampler's inverse-CDF draw: 200k rows of one distribution hit each token at its probability
    (never one of probability 0); greedy takes the argmax; the scores it returns make that token the argmax."""
    import torch

    from infra.generation import Sampler

    torch.manual_seed(0)
    logits = torch.tensor([0.0, 1.0, float("-inf"), 2.0, -1.0])
    probs = torch.softmax(logits / 0.5, -1)
    s = Sampler(0.5, greedy)
    out = s(None, logits.repeat(200_000, 1))
    picked = out.argmax(-1)
    freq = torch.bincount(picked, minlength=5).double() / len(picked)
    if greedy:
        assert (picked == 3).all() and torch.allclose(s.logprobs()[:, 0], torch.log_softmax(logits, -1)[3])
    else:
        assert freq[2] == 0 and torch.allclose(freq, probs.double(), atol=3e-3)
        torch.testing.assert_close(s.logprobs()[:, 0], probs.log()[picked])
    assert (out.isinf().sum(-1) == 4).all()
    if not greedy:
        with pytest.raises(FloatingPointError, match="not finite"):
            s(None, torch.tensor([[0.0, float("nan"), 1.0]]))


class _Chars:
    """A tokenizer whose token t is the character chr(t)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(t) for t in ids)


def test_response_end_is_the_first_stop_token_or_stop_string():
    from infra.generation import response_end

    toks = [ord(c) for c in "ab```cd"]
    assert response_end(_Chars(), toks, set(), ("```",)) == 5  # through the token completing the stop string
    assert response_end(_Chars(), toks, {ord("b")}, ("```",)) == 2  # the stop token comes first
    assert response_end(_Chars(), toks, {ord("d")}, ("```",)) == 5
    assert response_end(_Chars(), toks, set(), ("zz",)) is None  # neither: cut at the budget
    assert response_end(_Chars(), toks, set(), ("zz", "\n\n")) is None
    assert response_end(_Chars(), toks, set(), ()) is None


def test_stop_strings_end_a_row_and_leave_its_batch_mates(policy):
    from infra.generation import generate

    prompts = [[1, 5, 9, 12], [1, 7, 3]]
    with policy.acting("a") as m:
        free = generate(m, policy.tokenizer, prompts, 12, greedy=True, batch_size=4, stop_ids=[-1])
        decode = policy.tokenizer.decode
        stop = decode(free[0].response_ids[:4])[-2:]  # a string that completes within the first 4 tokens
        cut = generate(m, policy.tokenizer, prompts, 12, greedy=True, batch_size=4, stop_ids=[-1], stop_strings=(stop,))
    k = next(k for k in range(1, 5) if stop in decode(free[0].response_ids[:k]))
    assert cut[0].response_ids == free[0].response_ids[:k] and not cut[0].truncated and cut[0].text.endswith(stop)
    assert cut[0].logprobs == pytest.approx(free[0].logprobs[:k])
    if stop not in free[1].text:  # the other row runs to its budget, as before
        assert cut[1].response_ids == free[1].response_ids and cut[1].truncated


@pytest.mark.parametrize("greedy", [False, True])
def test_generation_logprobs_are_the_teacher_forced_ones(policy, greedy):
    """What generate records step by step (its Sampler) is log softmax(logits / T) of the sampled
    tokens, as scoring the finished responses gives it (greedy: T = 1)."""
    import torch

    from infra.generation import generate, score_logprobs

    prompts = [[1, 5, 9, 12], [1, 7], [3, 3, 3, 3, 3, 3]]
    torch.manual_seed(5)
    with policy.acting("b") as m:
        gens = generate(m, policy.tokenizer, prompts, 9, temperature=0.7, greedy=greedy, batch_size=2)
        want = score_logprobs(
            m,
            prompts,
            [g.response_ids for g in gens],
            policy.tokenizer.pad_token_id,
            temperature=1.0 if greedy else 0.7,
        )
    for g, w in zip(gens, want):
        assert len(g.response_ids) == len(g.logprobs) == 9 and g.logprobs == pytest.approx(w, abs=1e-4)


@pytest.mark.parametrize(
    "cap, rows", [(2048, [[1, 5, 9, 12], [7, 8]]), (8, [[1, 5, 9, 12], [7, 8], [1, 5, 9, 12]])]
)  # 4 + 3 + 1 fills a row
def test_repeated_prompts_are_run_once_with_the_same_logprobs_and_gradient(policy, monkeypatch, cap, rows):
    """response_logits runs each distinct prompt once, its responses packed after it (a row longer than
    PACK_TOKENS starts another); the log-probs and their gradient match scoring every (prompt, response)
    pair on its own."""
    import torch

    import infra.generation as gen

    prompts = [[1, 5, 9, 12], [1, 5, 9, 12], [7, 8], [1, 5, 9, 12], [7, 8]]
    responses = [[4, 6, 7], [8], [3, 3, 3, 3], [2, 2], [9, 10]]
    pad, params = policy.tokenizer.pad_token_id, policy.parameters("a")
    calls, packed = [], gen._packed_logits
    monkeypatch.setattr(gen, "_packed_logits", lambda *a: calls.append(a[1]) or packed(*a))
    monkeypatch.setattr(gen, "PACK_TOKENS", cap)
    with policy.acting("a") as m:
        got = gen.response_logprobs(m, prompts, responses, pad, 0.7)
        grad_got = torch.autograd.grad(got.sum(), params)
        want = [gen.response_logprobs(m, [p], [r], pad, 0.7)[0] for p, r in zip(prompts, responses)]
        grad_want = torch.autograd.grad(sum(w.sum() for w in want), params)
    assert calls == [rows]  # one forward, one row per prompt (up to the cap)
    for row, w in zip(got, want):
        torch.testing.assert_close(row[: len(w)], w, atol=1e-5, rtol=0)
        assert not row[len(w) :].any()
    assert sum(b.norm() for b in grad_want) > 0
    with torch.no_grad(), policy.acting("a") as m:  # an empty response packs too, with no log-probs
        assert not gen.response_logprobs(m, [[1, 5], [1, 5]], [[3], []], pad)[1].any()
    for a, b in zip(grad_got, grad_want):  # float32 sums in another order: equal to 1e-4 of the norm
        assert (a - b).norm() <= 1e-4 * b.norm()


def test_rescore_replaces_engine_logprobs_with_the_trainers(policy):
    from infra.generation import score_logprobs
    from tasks.collect_rollouts import rescore

    acts = [
        {"agent": "a", "episode_id": "e0", "prompt_ids": [1, 5, 9], "response_ids": [4, 6], "logprobs": [0.0, 0.0]},
        {"agent": "b", "episode_id": "e0", "prompt_ids": [1, 7], "response_ids": [3], "logprobs": [0.0]},
        {"agent": "a", "episode_id": "e1", "prompt_ids": [1], "response_ids": [8, 8, 8], "logprobs": [0.0] * 3},
    ]
    gaps = rescore(policy, acts, batch_size=2, temperature=0.7)
    with policy.acting("a") as m:
        want = score_logprobs(m, [[1, 5, 9], [1]], [[4, 6], [8, 8, 8]], policy.tokenizer.pad_token_id, temperature=0.7)
    assert acts[0]["logprobs"] == want[0] and acts[2]["logprobs"] == want[1]
    assert gaps["e1"] == pytest.approx(sum(-x for x in want[1]) / 3)
    assert set(gaps) == {"e0", "e1"}


# -- the coach's client pool -----------------------------------------------------------------------------
def test_client_pool_keeps_order_and_bounds_concurrency():
    lock, now, peak = threading.Lock(), [0], [0]

    def call(x):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.02)
        with lock:
            now[0] -= 1
        return x * x

    assert ClientPool(max_concurrency=3).map(call, range(12)) == [x * x for x in range(12)]
    assert peak[0] <= 3
    assert ClientPool(2).map(call, []) == []
    with pytest.raises(ValueError):
        ClientPool(0)


def test_llm_coach_scores_through_its_pool():
    from tasks.coach import CoachConfig, LLMCoach

    coach = LLMCoach(CoachConfig(backend="llm", concurrency=5, cache=False))
    assert isinstance(coach.pool, ClientPool) and coach.pool.max_concurrency == 5


# -- the run config ----------------------------------------------------------------------------------------
def test_gpu_preset_and_engine_checks():
    from flows.config import ConfigError, load_config

    cfg = load_config("mathchat-gpu", [])
    assert (cfg.engines.generation, cfg.engines.trainer, cfg.engines.device) == ("vllm", "deepspeed", "cuda")
    assert cfg.engines.deepspeed.zero_stage == 3 and cfg.model.weights == "lora" and cfg.model.dtype == "bfloat16"
    with pytest.raises(ConfigError, match="needs model.weights=lora"):
        load_config("mathchat-gpu", ["model.weights=full"])
    with pytest.raises(ConfigError, match="cannot serve model.name=tiny"):
        load_config("tiny", ["engines.generation=vllm"])
    with pytest.raises(ConfigError, match="set engines.device=cuda"):
        load_config("tiny", ["engines.trainer=deepspeed"])
    with pytest.raises(ConfigError, match=r"engines.generation: .*unknown generation engine 'sglang'; known: hf, vllm"):
        load_config("tiny", ["engines.generation=sglang"])
    assert load_config("tiny", ["engines.vllm.gpu_memory_utilization=0.5"]).engines.vllm.gpu_memory_utilization == 0.5
