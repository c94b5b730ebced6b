"""Engines and an estimator from outside the package, as docs/guides/extending.md describes them; each
records in CALLS that it ran, for tests/test_plugins.py, which names this module in a run's `plugins`.
The engines are the built-in `hf` generation and `torch` trainer; the estimator is a trajectory-level one
with no KL term, and declares so where it is registered."""

from __future__ import annotations

import numpy as np

from infra.engines import REGISTRY, EngineSpec
from infra.engines.hf import HFGeneration
from infra.engines.torch import TorchTrainer
from tasks.advantages import Sample, register

CALLS: list[tuple[str, ...]] = []  # (what ran, for which agents), in order


class RecordingGeneration(HFGeneration):
    name = "recording"

    def generate(self, request):
        CALLS.append(("generate", request.agent))
        return super().generate(request)


class RecordingTrainer(TorchTrainer):
    name = "recording"

    def train(self, policy, agent, items, loss_fn, spec):
        CALLS.append(("train", agent))
        return super().train(policy, agent, items, loss_fn, spec)


REGISTRY["generation"].register("recording", EngineSpec(f"{__name__}:RecordingGeneration", ()))
REGISTRY["trainer"].register("recording", EngineSpec(f"{__name__}:RecordingTrainer", ()))


@register("centred", trajectory=True)
def centred(samples: list[Sample], **_) -> list[np.ndarray]:
    """A = R - the batch's mean reward on every token, R the episode's reward (unscaled: `scale` is the same)."""
    CALLS.append(("estimate", *sorted({s.agent for s in samples})))
    mean = np.mean([s.score for s in samples])
    return [np.full(len(s.logprobs), s.score - mean) for s in samples]
