"""Components chosen by name from the config: pipelines, advantage estimators, losses, engines.

Each kind has one `Registry`; a module adds to it with `@REGISTRY.register("name")` (or
`REGISTRY.register("name", value)`), including a user's module outside the package, imported before the
run starts. Registering a name twice is an error (two components cannot answer to one name), and looking up
an unknown name raises a UsageError that lists the known ones.

A kind whose components differ in what the rest of teamrl must know of them without calling them (does an
estimator have a KL term, is a loss advantage-weighted) has a traits dataclass: each component declares its
traits where it is registered (`register("name", uses_kl=True)`), the fields it leaves out take the
dataclass's defaults, and `REGISTRY.traits("name")` returns them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, NoReturn, overload

from typing_extensions import TypeVar  # a TypeVar default (typing has it from Python 3.13)

from infra.errors import UsageError


@dataclass(frozen=True)
class NoTraits:
    """The traits of a kind whose components declare none (pipelines and engines: their class says it all)."""


T = TypeVar("T")
A = TypeVar("A", default=NoTraits)


class Registry(dict[str, T], Generic[T, A]):
    """name -> component of one `kind` (e.g. "estimator"), in registration order, and each name's traits:
    an `A` made of the keywords given to `register`."""

    @overload
    def __init__(self: Registry[T, NoTraits], kind: str) -> None: ...
    @overload
    def __init__(self, kind: str, traits: type[A]) -> None: ...
    def __init__(self, kind: str, traits: type = NoTraits) -> None:
        super().__init__()
        self.kind = kind
        self.trait_type: type[A] = traits
        self._traits: dict[str, A] = {}

    def register(self, name: str, value: T | None = None, **traits):
        """Add `value` as `name` with its `traits` (fields of the kind's traits dataclass; a keyword it has
        not is a TypeError), or (without a value) decorate the component to add."""

        def add(v: T) -> T:
            if name in self:
                raise ValueError(f"{self.kind} {name!r} is registered twice: {self[name]!r} and {v!r}")
            self._traits[name] = self.trait_type(**traits)
            self[name] = v
            return v

        return add if value is None else add(value)

    def traits(self, name: str) -> A:
        """The traits `name` was registered with."""
        if name not in self:
            self.unknown(name)
        return self._traits[name]

    def unknown(self, name: str) -> NoReturn:
        raise UsageError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self))}")

    def __missing__(self, name: str) -> T:
        self.unknown(name)
