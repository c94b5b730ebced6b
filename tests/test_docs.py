"""The docs site: its generated pages are current, every TEAMRL_* variable is documented, the README's links
into docs/ resolve, and `mkdocs build --strict` passes (what CI runs through `make test`)."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flows.reference import pages

ROOT = Path(__file__).resolve().parents[1]


def _words(text: str) -> str:
    """A help screen's words in order: rich's boxes and line wrapping vary with its version, not the content."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_generated_reference_pages_are_current():
    for path, text in pages().items():
        same = _words if path.name == "cli.md" else str
        assert path.exists() and same(path.read_text()) == same(text), (
            f"{path.relative_to(ROOT)} is stale: run `.venv/bin/python -m flows.reference`"
        )


def test_a_column_without_a_description_stops_the_schema_page(monkeypatch):
    import pyarrow as pa

    from flows import reference

    coach = reference.SCHEMAS["coach"]
    monkeypatch.setitem(reference.SCHEMAS, "coach", coach.append(pa.field("new_column", pa.string())))
    with pytest.raises(ValueError, match="column coach.new_column has no description"):
        reference.schemas_page()


def test_every_teamrl_variable_the_code_reads_is_documented():
    sources = [
        p for d in ("flows", "tasks", "infra", "pipelines") for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".sh")
    ] + [ROOT / "Makefile", ROOT / ".ci" / "run"]
    names = {m for p in sources for m in re.findall(r"\bTEAMRL_[A-Z][A-Z_]*[A-Z]\b", p.read_text())}
    assert {"TEAMRL_CACHE", "TEAMRL_PROGRESS", "TEAMRL_FAULT"} <= names  # the scan finds what it should
    page = (ROOT / "docs" / "reference" / "environment.md").read_text()
    assert not (missing := sorted(n for n in names if f"`{n}`" not in page)), (
        f"document {missing} in docs/reference/environment.md"
    )


def test_readme_links_into_the_docs_resolve():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", readme)
    assert len(links) >= 10, "the README links into the docs pages"
    assert not (broken := [link for link in links if not (ROOT / link).is_file()]), broken


def test_mkdocs_build_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed: `pip install -e '.[docs]'` (make test installs it)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()
    notebook = (tmp_path / "site" / "results" / "notebook" / "index.html").read_text()
    assert "Occupancy-shift scaling" in notebook, "benchmarks/README.md is included in the results"
