"""The run config (`RunConfig`, tasks/config.py) loaded from a YAML preset and overridden with
`--set key=value`. Errors name the field and nothing is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tasks.config import ConfigError, RunConfig, format_errors, validate

PRESETS = Path(__file__).parent / "presets"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def _set(d: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        nxt = d.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: `{k}` is a value, not a section")
        d = nxt
    d[keys[-1]] = value


def parse_overrides(items: list[str]) -> list[tuple[str, Any, str]]:
    """(key, YAML-parsed value, raw text) per `key=value`."""
    out = []
    for it in items:
        if "=" not in it or not it.split("=", 1)[0].strip():
            raise ConfigError(f"override {it!r}: expected key=value, e.g. --set seed=3")
        k, v = it.split("=", 1)
        try:
            val = yaml.safe_load(v) if v.strip() else ""
        except yaml.YAMLError:
            val = v
        out.append((k.strip(), val, v))
    return out


def read_mapping(path: Path) -> dict:
    """A YAML file whose top level is a mapping (a preset, a run config, a sweep file)."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return raw


def load_config(preset: str, overrides: list[str] | None = None) -> RunConfig:
    """Load a preset by name (flows/presets/<name>.yaml) or a YAML path, then apply overrides."""
    path = Path(preset)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = PRESETS / f"{preset}.yaml"
        if not path.exists():
            raise ConfigError(f"no preset or YAML file {preset!r}; presets: {', '.join(preset_names())}")
    raw = read_mapping(path)
    raw.setdefault("preset", path.stem)
    parsed = parse_overrides(overrides or [])
    for k, v, _ in parsed:
        _set(raw, k, v)
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        # `--set run.id=123` means the text "123" where the field is a string: retry those as text
        texts = {".".join(map(str, err["loc"])) for err in e.errors() if err["type"] == "string_type"}
        retry = [(k, t) for k, v, t in parsed if k in texts and not isinstance(v, str)]
        if not retry:
            raise ConfigError(format_errors(e)) from None
        for k, t in retry:
            _set(raw, k, t)
        return validate(raw, RunConfig)
