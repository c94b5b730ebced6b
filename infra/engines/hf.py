"""The `hf` generation engine: transformers `generate` on the team's own model (infra/generation.py),
the acting agent's adapter switched on (folded into the base weights for the call unless
`engines.fold_adapter` is false). The CPU default; it shares the weights the trainer updates, so a
checkpoint loaded into the team (TeamPolicy.load) is what it serves."""

from __future__ import annotations

import torch

from infra.engines.types import Generation, GenerationRequest
from infra.generation import generate


class HFGeneration:
    name = "hf"

    def __init__(self, policy, model_cfg, engines, agents: list[str], seed: int):
        self.policy, self.batch_size = policy, engines.batch_size
        self.weights = policy.sampling if engines.fold_adapter else policy.acting

    def use(self, run_dir, versions: dict[str, int]) -> None:
        for agent, v in versions.items():
            self.policy.load(run_dir, agent, v)

    def generate(self, request: GenerationRequest) -> list[Generation]:
        torch.manual_seed(request.seed)
        with self.weights(request.agent) as model:
            return generate(
                model,
                self.policy.tokenizer,
                request.prompts,
                request.max_new_tokens,
                temperature=request.temperature,
                greedy=request.greedy,
                batch_size=self.batch_size,
                stop_ids=list(request.stop_ids) if request.stop_ids else None,
                stop_strings=request.stop_strings,
            )

    def sleep(self) -> None:
        pass

    def close(self) -> None:
        pass
