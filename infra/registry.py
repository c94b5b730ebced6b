"""MLflow model registry: one registered model per agent (`<prefix>-<agent>`), one version per finished
training run (its final checkpoint, logged as the run's `checkpoints/<agent>/vNNNN` artifact), and the
alias `best` on the version with the highest held-out success. MLflow reserves `@latest` and resolves it
to the newest version itself, so `models:/<name>@latest` and `models:/<name>@best` both load."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from infra.errors import UsageError

URI_RE = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[\w-]+)|/(?P<version>\d+))$")
SUCCESS_TAG = "teamrl.eval_success"


@dataclass
class Registered:
    name: str
    version: str
    best: bool  # the `best` alias points at this version now


def model_name(prefix: str, agent: str) -> str:
    """A registered-model name: `<prefix>-<agent>` with anything but letters, digits, `.`, `_`, `-` as `-`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{prefix}-{agent}")


def register_agents(
    client, mlflow_run_id: str, prefix: str, versions: dict[str, int], tags: dict[str, str], success: float | None
) -> list[Registered]:
    """Register each agent's checkpoint `versions[agent]` of this MLflow run (idempotent: a resumed run
    does not add the same checkpoint twice); move `best` when `success` beats the current best's."""
    from mlflow.exceptions import MlflowException

    artifacts = client.get_run(mlflow_run_id).info.artifact_uri
    out = []
    for agent, ckpt in versions.items():
        name = model_name(prefix, agent)
        try:
            client.get_registered_model(name)
        except MlflowException:
            client.create_registered_model(name, description=f"teamrl agent `{agent}` ({prefix})")
        mine = {
            "teamrl.agent": agent,
            "teamrl.checkpoint": str(ckpt),
            **tags,
            **({SUCCESS_TAG: f"{success:.6f}"} if success is not None else {}),
        }
        same = [
            v
            for v in client.search_model_versions(f"name='{name}' and run_id='{mlflow_run_id}'")
            if v.tags.get("teamrl.checkpoint") == str(ckpt)
        ]
        mv = (
            same[0]
            if same
            else client.create_model_version(
                name, f"{artifacts}/checkpoints/{agent}/v{ckpt:04d}", run_id=mlflow_run_id, tags=mine
            )
        )
        best = success is not None and success > _best_success(client, name)
        if best:
            client.set_registered_model_alias(name, "best", mv.version)
        out.append(Registered(name, str(mv.version), best))
    return out


def registered_checkpoints(client, mlflow_run_id: str) -> dict[str, set[int]]:
    """agent -> the checkpoint versions of this MLflow run that teamrl registered (pruning keeps them)."""
    out: dict[str, set[int]] = {}
    for mv in client.search_model_versions(f"run_id='{mlflow_run_id}'"):
        if "teamrl.agent" in mv.tags and "teamrl.checkpoint" in mv.tags:
            out.setdefault(mv.tags["teamrl.agent"], set()).add(int(mv.tags["teamrl.checkpoint"]))
    return out


def _best_success(client, name: str) -> float:
    """The held-out success recorded on the version `best` points at (-inf when there is none)."""
    from mlflow.exceptions import MlflowException

    try:
        return float(client.get_model_version_by_alias(name, "best").tags.get(SUCCESS_TAG, "-inf"))
    except MlflowException:
        return float("-inf")


def resolve(uri: str, tracking_uri: str, dst: str | Path):
    """(local checkpoint folder, model version) of `models:/<name>@<alias>` or `models:/<name>/<version>`,
    downloaded under `dst`. Errors name the registered models that exist."""
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    m = URI_RE.match(uri)
    if not m:
        raise UsageError(f"{uri!r} is not a registry URI: expected models:/<name>@<alias> or models:/<name>/<version>")
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        mv = (
            client.get_model_version_by_alias(m["name"], m["alias"])
            if m["alias"]
            else client.get_model_version(m["name"], m["version"])
        )
    except MlflowException as e:
        known = sorted(r.name for r in client.search_registered_models())
        raise UsageError(
            f"{uri}: {e.message.splitlines()[0]} (registered models in {tracking_uri}: {', '.join(known) or 'none'})"
        ) from None
    if "teamrl.agent" not in mv.tags:
        raise UsageError(f"{uri} (version {mv.version}) was not registered by teamrl: it has no teamrl.agent tag")
    local = mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(dst), tracking_uri=tracking_uri)
    return Path(local), mv
