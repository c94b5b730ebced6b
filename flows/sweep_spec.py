"""A sweep file: one base run config, named variants of it (each a list of `key=value` overrides), the
training seeds, and the contrasts (variant pairs) its report compares. `teamrl sweep FILE` trains every
(variant, seed) as run `<name>-<variant>-s<seed>` (flows/sweep.py); `teamrl report FILE` compares them
(flows/sweep_report.py). Paths in the file are relative to the file."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flows.config import load_config, parse_overrides, read_mapping
from tasks.config import ConfigError, RunConfig, validate

NAME = r"^[a-z0-9][a-z0-9.-]{0,39}$"
# what the sweep sets on every run itself: a variant that set them would break the run ids or the seeds
OWNED = ("seed", "run.id", "run.dir", "iterations", "eval_every", "run.mlflow_parent")


class Contrast(BaseModel):
    """A − B, paired by seed and question; with a claim, a row of the README's claims table."""

    model_config = ConfigDict(extra="forbid")

    a: str = Field(..., description="the variant in front")
    b: str = Field(..., description="the variant it is compared with")
    claim: str = Field("", description="the claim A − B > 0 stands for, in words (the README's claims table)")
    paper: str = Field("", description="where the claim comes from, e.g. MAPPA")

    @model_validator(mode="before")
    @classmethod
    def _pair(cls, v):
        """`[A, B]` is short for `{a: A, b: B}`."""
        if isinstance(v, list | tuple):
            if len(v) != 2:
                raise ValueError(f"a contrast is [A, B], got {list(v)}")
            return {"a": v[0], "b": v[1]}
        return v


class GainClaim(BaseModel):
    """A claim that training a variant improves it (final − untrained, paired by question): a claims-table row."""

    model_config = ConfigDict(extra="forbid")

    variant: str = Field(..., description="the variant whose gain the claim is about")
    claim: str = Field(..., description="the claim, in words")
    paper: str = Field("", description="where the claim comes from")


class ReportSpec(BaseModel):
    """What `teamrl report` compares."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field("success", description="the per-question metric compared (an episode metric; 1/0 or a score)")
    also: list[str] = Field([], description="more per-question metrics shown before -> after training")
    groups: list[str] = Field(
        [], description="per-question 0/1 metrics that mark a group of questions: the metric on each group"
    )
    gains: list[GainClaim] = Field([], description="claims that training a variant improves it (claims table)")


class SweepSpec(BaseModel):
    """Variants × seeds of one base config, and what to compare."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., pattern=NAME, description="the sweep's name; its runs are `<name>-<variant>-s<seed>`")
    description: str = Field("", description="what the sweep asks, for the report's first lines")
    base: str = Field(..., description="preset name, or a YAML run config (a path relative to the sweep file)")
    set: list[str] = Field([], description="key=value overrides applied to every run, before the variant's own")
    variants: dict[str, list[str]] = Field(
        ..., min_length=1, description="variant name -> its key=value overrides (an empty list: the base itself)"
    )
    seeds: list[int] = Field(..., min_length=1, description="training seeds; each variant runs once per seed")
    contrasts: list[Contrast] = Field(
        [], description="variant pairs [A, B] the report compares as A − B, paired by seed and question"
    )
    report: ReportSpec = Field(ReportSpec(), description="what `teamrl report` compares")
    iterations: int | None = Field(None, ge=1, description="training iterations of every run (default: the base's)")
    eval_every: int | None = Field(
        None, ge=0, description="held-out evaluation every this-many iterations (default: the base's)"
    )
    problems: dict[str, str] = Field(
        {},
        description="more held-out sets, name -> a JSONL problem file (relative to the sweep file), played "
        "greedily by each run's final team as `teamrl eval RUN --problems FILE` does",
    )
    runs_dir: str = Field("runs", description="folder the runs are trained in (and the MLflow database)")
    records: str | None = Field(
        None, description="folder of the per-run records (default: records/<name> beside the sweep file)"
    )
    concurrency: int = Field(
        1,
        ge=1,
        description="runs trained at once; above 1 the runs go to `deployment`, whose workers train one each",
    )
    deployment: str = Field(
        "",
        description="a deployment of the train flow (`make server` deploys `train/sweep-run` on its work pool): "
        "each run becomes a flow run of it that the pool's workers pick up, at most `concurrency` at a time "
        "(a Prefect global concurrency limit `sweep-<name>`); the runs folder must be one path the workers "
        "share. Empty: the runs train in this process, one after another",
    )
    note: str = Field("", description="recorded with each run: e.g. what else shared the machine")

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        import re

        bad = [v for v in self.variants if not re.match(NAME, v)]
        if bad:
            raise ValueError(f"variant names are lowercase letters, digits, dots and dashes: {bad}")
        if len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ValueError(f"seeds must be distinct and >= 0, got {self.seeds}")
        for c in self.contrasts:
            a, b = c.a, c.b
            if a == b or a not in self.variants or b not in self.variants:
                raise ValueError(f"contrast [{a}, {b}]: two different variants of {sorted(self.variants)}")
        for where, items in [("set", self.set), *((f"variants.{v}", s) for v, s in self.variants.items())]:
            owned = [k for k, _, _ in parse_overrides(items) if k in OWNED]
            if owned:
                raise ValueError(f"{where}: {', '.join(owned)} are set by the sweep for each run")
        if unknown := [g.variant for g in self.report.gains if g.variant not in self.variants]:
            raise ValueError(f"report.gains: no variant {unknown[0]!r} in {sorted(self.variants)}")
        if self.concurrency > 1 and not self.deployment:
            raise ValueError("concurrency > 1 needs `deployment`: runs in this process train one after another")
        return self

    def run_id(self, variant: str, seed: int) -> str:
        return f"{self.name}-{variant}-s{seed}"

    def cells(self) -> list[tuple[str, int]]:
        """(variant, seed) in the order they run: seed by seed, so an interrupted sweep has whole seeds."""
        return [(v, s) for s in self.seeds for v in self.variants]

    def records_dir(self) -> Path:
        return Path(self.records) if self.records else Path("records") / self.name

    def run_config(self, variant: str, seed: int, parent: str | None = None) -> RunConfig:
        """The config of run (variant, seed): base, then `set`, then the variant's overrides, then the sweep's own."""
        own = [f"seed={seed}", f"run.id={self.run_id(variant, seed)}", f"run.dir={self.runs_dir}"]
        own += [f"iterations={self.iterations}"] if self.iterations is not None else []
        own += [f"eval_every={self.eval_every}"] if self.eval_every is not None else []
        own += [f"run.mlflow_parent={parent}"] if parent else []
        return load_config(self.base, [*self.set, *self.variants[variant], *own])


def _relative_to(folder: Path, path: str) -> str:
    p = Path(path)
    return str(p if p.is_absolute() else folder / p)


def load_sweep(path: str | Path) -> SweepSpec:
    """A sweep file validated, its paths made relative to where it is, and every run's config built once
    (so a bad override fails here, before anything trains)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no sweep file {str(path)!r}")
    raw = read_mapping(path)
    here = path.parent
    if str(raw.get("base", "")).endswith((".yaml", ".yml")):
        raw["base"] = _relative_to(here, raw["base"])
    if isinstance(raw.get("problems"), dict):
        raw["problems"] = {k: _relative_to(here, str(v)) for k, v in raw["problems"].items()}
    raw["records"] = _relative_to(here, str(raw.get("records") or Path("records") / str(raw.get("name", ""))))
    spec = validate(raw, SweepSpec)
    for name, file in spec.problems.items():
        if not Path(file).is_file():
            raise ConfigError(f"problems.{name}: no such file {file!r}")
    for variant, seed in spec.cells():
        try:
            spec.run_config(variant, seed)
        except ConfigError as e:
            raise ConfigError(f"variant {variant!r}: {e}") from None
    return spec
