"""Components chosen by name from the config: pipelines, advantage estimators, losses, engines.

Each kind has one `Registry`; a module adds to it with `@REGISTRY.register("name")` (or
`REGISTRY.register("name", value)`), including a user's module outside the package, imported before the
run starts. Registering a name twice is an error (two components cannot answer to one name), and looking up
an unknown name raises a UsageError that lists the known ones.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from infra.errors import UsageError

T = TypeVar("T")


class Registry(dict[str, T], Generic[T]):
    """name -> component of one `kind` (e.g. "estimator"), in registration order."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str, value: T | None = None):
        """Add `value` as `name`, or (without a value) decorate the component to add."""

        def add(v: T) -> T:
            if name in self:
                raise ValueError(f"{self.kind} {name!r} is registered twice: {self[name]!r} and {v!r}")
            self[name] = v
            return v

        return add if value is None else add(value)

    def __missing__(self, name: str) -> T:
        raise UsageError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self))}")
