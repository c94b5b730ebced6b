"""The import graph of the product packages, read from the source (every import statement, at module level
or inside a function): no cycle anywhere, imports only downward (flows -> tasks -> pipelines, infra;
pipelines -> infra), and the generic layers never reach a dual-system (MARS) module or field."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "tasks", "pipelines", "infra", "benchmarks")
# what each package may import of ours besides itself
LAYERS = {
    "flows": {"tasks", "pipelines", "infra"},
    "tasks": {"pipelines", "infra"},
    "pipelines": {"infra"},
    "infra": set(),
    "benchmarks": {"flows", "tasks", "pipelines", "infra"},
}
MARS_MODULES = ("pipelines.deepresearch", "pipelines.dual_system")
# fields only a dual-system team's config or rows have (pipelines/dual_system, pipelines/deepresearch)
MARS_FIELDS = {"bin_tokens", "balance", "system1", "system1_credit", "system1_chat", "system"}


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ours that module `name` imports (a `from a import b` of a submodule b: a.b)."""

    def ours(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {ours(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in known else ours(base))
    return {m for m in found if m and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                out.append(sorted([v, *comp]))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_a_cycle_and_a_submodule_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    known = modules()
    assert "pipelines.dsbench.synthetic" in imported("pipelines.dsbench.data", known["pipelines.dsbench.data"], known)


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_imports_go_down_the_layers():
    wrong = sorted(
        f"{m} -> {t}"
        for m, targets in graph().items()
        for t in targets
        if t.split(".")[0] != m.split(".")[0] and t.split(".")[0] not in LAYERS[m.split(".")[0]]
    )
    assert wrong == []


def test_generic_stages_never_import_a_dual_system_module():
    reach = sorted(
        f"{m} -> {t}"
        for m, targets in graph().items()
        if m.startswith(("tasks", "flows"))
        for t in targets
        if t.startswith(MARS_MODULES)
    )
    assert reach == []


def test_tasks_read_no_dual_system_field():
    """No attribute or string key of a MARS-only field in tasks/: a pipeline's hooks read them."""
    reads = []
    for path in sorted((ROOT / "tasks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in MARS_FIELDS:
                reads.append(f"{path.name}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                if node.slice.value in MARS_FIELDS:
                    reads.append(f"{path.name}:{node.lineno} [{node.slice.value!r}]")
    assert reads == []
