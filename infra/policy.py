"""A team's weights: one frozen base model plus trainable weights per weights unit (a peft LoRA adapter,
or a full copy, each), with versioned checkpoints on disk. A unit plays one agent or several (MARS's
shared model plays System 2 and System 1): every method taking an agent accepts a role or a unit."""

from __future__ import annotations

import copy
import json
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Collection
from contextlib import contextmanager
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

from infra.disk import writing
from infra.faults import crash_point
from infra.models import ModelConfig, load_base, load_tokenizer

OPTIMIZER = "optimizer.pt"  # in a checkpoint folder: the AdamW moments the update starting from it loads


class CheckpointConfig(BaseModel):
    """Which checkpoint versions a run keeps on disk."""

    model_config = ConfigDict(extra="forbid")

    keep_every: int = Field(
        1,
        ge=1,
        description="keep the weights of every this-many-th version (0, K, 2K, ...), "
        "besides the latest, the ones the next and the last update start from and those "
        "registered in MLflow; 1 keeps every version. The optimizer state is kept only where the "
        "next and the last update start",
    )


class TeamPolicy:
    """Long-lived: built once per process and run, then moved between checkpoint versions."""

    def __init__(
        self,
        cfg: ModelConfig,
        agents: list[str],
        seed: int = 0,
        device: str = "cpu",
        roles: dict[str, str] | None = None,
    ):
        """`agents`: the weights units; `roles`: role -> the unit that plays it (default: none besides them)."""
        self.cfg, self.agents, self.device = cfg, list(agents), device
        self.roles = dict(roles or {})
        if stray := set(self.roles.values()) - set(self.agents):
            raise ValueError(f"roles played by weights {sorted(stray)} outside the team's {self.agents}")
        self.tokenizer = load_tokenizer(cfg)
        base = load_base(cfg, self.tokenizer, seed).to(device)
        # A trainer whose engine partitions parameters (DeepSpeed ZeRO-3) sets this to a context manager
        # `gather(params, modify)` that makes them whole for uses outside its engine (see `materialized`).
        self.gather = None
        # agent -> (run folder, version) whose weights are in memory; one TeamPolicy may serve many runs
        self._loaded: dict[str, tuple[str, int]] = {a: ("<initial>", 0) for a in self.agents}
        if cfg.weights == "lora":
            from peft import LoraConfig, get_peft_model

            lc = LoraConfig(
                r=cfg.lora_rank,
                lora_alpha=cfg.lora_alpha,  # type: ignore[arg-type]  # peft annotates int; it scales by alpha / r
                lora_dropout=cfg.lora_dropout,
                target_modules=cfg.lora_targets,
                bias="none",
                task_type="CAUSAL_LM",
            )
            torch.manual_seed(seed)
            self.model = get_peft_model(base, lc, adapter_name=self.agents[0])
            for a in self.agents[1:]:
                self.model.add_adapter(a, lc)
            self.model.eval()
            self._params = {
                a: [p for n, p in self.model.named_parameters() if "lora_" in n and f".{a}." in n] for a in self.agents
            }
            self._initial = {a: [p.detach().clone() for p in self._params[a]] for a in self.agents}
        else:
            self.model = base
            self.copies = {a: copy.deepcopy(base) for a in self.agents}
            self._params = {a: list(m.parameters()) for a, m in self.copies.items()}
            self._initial = {a: list(self.model.parameters()) for a in self.agents}  # the base itself
        for a in self.agents:
            for p in self._params[a]:
                p.requires_grad_(True)

    def unit(self, agent: str) -> str:
        """The weights unit that plays `agent` (a role, or a unit itself)."""
        unit = self.roles.get(agent, agent)
        if unit not in self._loaded:
            raise KeyError(f"unknown agent {agent!r}; team is {self.agents}")
        return unit

    # -- which weights are active -------------------------------------------------------------
    @contextmanager
    def materialized(self, agent: str, modify: bool = False):
        """Agent `agent`'s trainable weights whole in memory for the block (`modify`: writes in the block
        are kept). A no-op unless a trainer partitions them (`gather`)."""
        agent = self.unit(agent)
        if self.gather is None:
            yield
        else:
            with self.gather(self._params[agent], modify):
                yield

    @contextmanager
    def acting(self, agent: str):
        """The module that computes agent `agent`'s policy."""
        agent = self.unit(agent)
        with self.materialized(agent):
            if self.cfg.weights == "lora":
                self.model.set_adapter(agent)
                for a in self.agents:  # set_adapter may toggle requires_grad; keep every adapter trainable
                    for p in self._params[a]:
                        p.requires_grad_(True)
                yield self.model
            else:
                yield self.copies[agent]

    @contextmanager
    def sampling(self, agent: str):
        """`acting(agent)` for gradient-free generation. With LoRA the agent's adapter is folded into the
        base weights for the block: W + s * B @ A, one matmul per layer and token instead of three
        (benchmarks/README.md has the figures). The folded tensors replace the base's for the block and
        the originals come back untouched after it; this costs one extra copy of the adapted weights
        while it lasts. Not folded (same as `acting`): full copies, partitioned weights (ZeRO-3), adapter
        layers other than a plain LoRA Linear, and a weight another module shares (a tied LM head)."""
        agent = self.unit(agent)
        with self.acting(agent) as model:
            layers = self._foldable(agent)
            if not layers:
                yield model
                return
            swapped = []
            try:
                with torch.no_grad():
                    for m in layers:  # W + s * B @ A
                        w = m.base_layer.weight
                        swapped.append((w, w.data))
                        # peft keeps adapters in float32 beside a bfloat16 base: fold in the base's dtype
                        b, a = (x[agent].weight.to(w.dtype) for x in (m.lora_B, m.lora_A))
                        w.data = torch.addmm(w.data, b, a, alpha=m.scaling[agent])
                with self.model.disable_adapter():
                    yield model
            finally:
                for w, data in swapped:
                    w.data = data

    def _foldable(self, agent: str) -> list:
        """The LoRA layers `sampling` folds agent's adapter into; empty when it must not fold."""
        if self.cfg.weights != "lora" or self.gather is not None:
            return []
        from peft.tuners.lora import Linear, LoraLayer

        layers = [m for m in self.model.modules() if isinstance(m, LoraLayer) and agent in m.lora_A]
        uses = Counter(id(p) for _, p in self.model.named_parameters(remove_duplicate=False))
        plain = all(
            type(m) is Linear
            and not m.fan_in_fan_out
            and not m.use_dora[agent]
            and not m.lora_bias[agent]
            and uses[id(m.base_layer.weight)] == 1
            for m in layers
        )
        return layers if plain else []

    @contextmanager
    def reference(self):
        """The frozen reference policy (the base: adapters disabled)."""
        if self.cfg.weights == "lora":
            with self.model.disable_adapter():
                yield self.model
        else:
            yield self.model

    def parameters(self, agent: str) -> list[torch.nn.Parameter]:
        return self._params[self.unit(agent)]

    # -- checkpoints ----------------------------------------------------------------------------
    def _state(self, agent: str) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.model, adapter_name=agent)

    def save(
        self,
        run_dir: str | Path,
        agent: str,
        version: int,
        extra: dict | None = None,
        optimizer_state: dict | None = None,
    ) -> Path:
        """Write checkpoints/<agent>/<version>/ atomically, then atomically move the `latest` pointer. A failed
        write leaves no temporary behind; a full disk raises infra.disk.DiskFullError."""
        from safetensors.torch import save_file, save_model

        agent = self.unit(agent)
        final = checkpoint_dir(run_dir, agent, version)
        root = final.parent
        tmp = root / f".tmp-{uuid.uuid4().hex}"
        pointer = root / f".tmp-latest-{uuid.uuid4().hex}"
        with writing(final, tmp, pointer):
            tmp.mkdir(parents=True)
            with self.materialized(agent):
                if self.cfg.weights == "lora":
                    state = {k: v.detach().contiguous().cpu() for k, v in self._state(agent).items()}
                    save_file(state, tmp / "adapter_model.safetensors")
                    self.model.peft_config[agent].save_pretrained(str(tmp))
                else:  # save_model de-duplicates tied weights (embeddings / lm_head)
                    save_model(self.copies[agent], str(tmp / "model.safetensors"))
            if optimizer_state is not None:
                with open(tmp / OPTIMIZER, "wb") as fh:  # to a path, torch would hide a full disk's errno
                    torch.save(optimizer_state, fh)
            (tmp / "meta.json").write_text(json.dumps({"agent": agent, "version": version, **(extra or {})}))
            crash_point("checkpoint")
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            pointer.write_text(str(version))
            os.replace(pointer, root / "latest")
        self._loaded[agent] = (_key(run_dir), version)
        return final

    def changing(self, agent: str) -> None:
        """Agent `agent`'s weights are about to change in memory (an update): until `save` records them as a
        version, they are no version's, so `load` reads the checkpoint again (after a failed update, say)."""
        self._loaded[self.unit(agent)] = ("<changed>", -1)

    def load(self, run_dir: str | Path, agent: str, version: int) -> None:
        """Load agent's weights at `version` of run `run_dir`; version 0 without a checkpoint = the initial weights."""
        agent = self.unit(agent)
        if self._loaded.get(agent) == (_key(run_dir), version):
            return
        from safetensors.torch import load_file, load_model

        d = saved_checkpoint(run_dir, agent, version)
        if d is None:
            with torch.no_grad(), self.materialized(agent, modify=True):
                for p, init in zip(self._params[agent], self._initial[agent]):
                    p.copy_(init)
            self._loaded[agent] = (_key(run_dir), 0)
            return
        with self.materialized(agent, modify=True):
            if self.cfg.weights == "lora":
                from peft import set_peft_model_state_dict

                set_peft_model_state_dict(self.model, load_file(d / "adapter_model.safetensors"), adapter_name=agent)
            else:
                load_model(self.copies[agent], str(d / "model.safetensors"))
        self._loaded[agent] = (_key(run_dir), version)


def checkpoint_dir(run_dir: str | Path, agent: str, version: int) -> Path:
    """checkpoints/<agent>/vNNNN/ of a run: the agent's weights at `version` (peft adapter or full model)."""
    return Path(run_dir) / "checkpoints" / agent / f"v{version:04d}"


def saved_checkpoint(run_dir: str | Path, agent: str, version: int) -> Path | None:
    """The checkpoint folder of agent's `version`; None for version 0 never saved (the initial weights). A
    version that was never written or was pruned raises FileNotFoundError."""
    d = checkpoint_dir(run_dir, agent, version)
    if d.is_dir():
        return d
    if version != 0:
        on_disk = ", ".join(map(str, checkpoint_versions(run_dir, agent))) or "none"
        raise FileNotFoundError(
            f"no checkpoint {d}: version {version} of {agent} was never written or was "
            f"pruned (checkpoint.keep_every); versions on disk: {on_disk}"
        )
    return None


def _key(run_dir: str | Path) -> str:
    return str(Path(run_dir).resolve())


def latest_version(run_dir: str | Path, agent: str) -> int:
    """The version the `latest` pointer names (0 when the agent was never updated)."""
    p = Path(run_dir) / "checkpoints" / agent / "latest"
    return int(p.read_text()) if p.exists() else 0


def checkpoint_versions(run_dir: str | Path, agent: str) -> list[int]:
    """The versions of agent's checkpoints on disk, ascending."""
    root = checkpoint_dir(run_dir, agent, 0).parent
    return sorted(int(d.name[1:]) for d in root.glob("v*") if d.is_dir() and d.name[1:].isdigit())


def prune_checkpoints(
    run_dir: str | Path, agent: str, keep_every: int, keep: Collection[int] = (), resume: Collection[int] | None = None
) -> int:
    """Delete from agent's checkpoints what no stage or resume of the run reads; returns the bytes freed.

    Only versions older than the latest are touched (the latest, and any above it whose save has not moved
    the pointer yet, stay whole), and the versions in `resume` stay whole too: those an update may start
    from (default: the latest), whose optimizer state that update reads. Of the other versions the optimizer
    state is deleted, and so are the weights unless the version is a multiple of `keep_every` or in `keep`
    (e.g. registered in MLflow). Call it when no stage can start from an older version any more: after an
    iteration's updates are all recorded in the `updates` table.
    """
    if keep_every < 1:
        raise ValueError(f"keep_every must be at least 1, got {keep_every}")
    latest = latest_version(run_dir, agent)
    resume = {latest} if resume is None else set(resume)
    freed = 0
    for v in checkpoint_versions(run_dir, agent):
        if v >= latest or v in resume:
            continue
        d = checkpoint_dir(run_dir, agent, v)
        if v % keep_every == 0 or v in keep:
            if (opt := d / OPTIMIZER).exists():
                freed += opt.stat().st_size
                opt.unlink()
            continue
        freed += sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        gone = d.with_name(f".tmp-pruned-{uuid.uuid4().hex}")
        os.replace(d, gone)  # a version is whole or absent: a kill mid-delete leaves a temporary to clean up
        shutil.rmtree(gone)
    return freed
