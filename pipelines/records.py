"""Users' JSONL files (problems, documents, tasks): one JSON object a line, read with errors that name
the file and the line, so that a bad file is refused before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

from infra.errors import UsageError


def records(path: str | Path) -> list[tuple[str, dict]]:
    """("file:line", object) for each non-blank line of a JSONL file."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    data = path.read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        bad_line = data[: e.start].count(b"\n") + 1
        raise UsageError(f"{path}:{bad_line}: not UTF-8 text") from e
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{path}:{i}: invalid JSON: {e}") from e
        if not isinstance(d, dict):
            raise UsageError(f"{path}:{i}: expected a JSON object, got {type(d).__name__}")
        out.append((f"{path}:{i}", d))
    if not out:
        raise UsageError(f"{path}: empty file")
    return out


def check_fields(
    where: str, d: dict, required: dict[str, tuple[type, ...]], optional: dict[str, tuple[type, ...]] | None = None
) -> None:
    """Refuse a record with a missing or unknown field, a value of another type (a bool is no number,
    though Python counts it as an int) or an empty string."""
    optional = optional or {}
    fields = ", ".join([*required, *(f"{k}?" for k in optional)])
    if missing := [k for k in required if k not in d]:
        raise UsageError(f"{where}: missing field(s) {', '.join(missing)} (fields: {fields})")
    if unknown := [k for k in d if k not in required and k not in optional]:
        raise UsageError(f"{where}: unknown field(s) {', '.join(unknown)} (fields: {fields})")
    for k, v in d.items():
        types = required.get(k) or optional[k]
        if isinstance(v, bool) or not isinstance(v, types):
            names = " or ".join({str: "a string", int: "an integer", float: "a number"}[t] for t in types)
            raise UsageError(f"{where}: {k} must be {names}, got {json.dumps(v)}")
        if isinstance(v, str) and not v.strip():
            raise UsageError(f"{where}: empty {k}")


def no_docs(pipeline: str, docs: str | None) -> None:
    """Refuse a documents file for a pipeline whose problems hold all they need."""
    if docs:
        raise UsageError(
            f"{docs}: the {pipeline} pipeline takes no documents file (--docs): its problems hold all they need"
        )
