"""The documentation: the generated reference page equals what the code generates, and every link of the
README (the front door, outside the MkDocs site, which `mkdocs build --strict` checks in CI) resolves."""

from __future__ import annotations

import re
from pathlib import Path

from clsr.study.spec.reference import reference_markdown

REPO_ROOT = Path(__file__).resolve().parents[4]


def test_the_committed_reference_is_the_generated_one():
    committed = (REPO_ROOT / "docs" / "reference.md").read_text()
    assert committed == reference_markdown(), "regenerate: platform study reference --out docs/reference.md"


def anchors(page: Path) -> set[str]:
    """MkDocs' heading ids (toc's default slugify) of a Markdown page."""
    ids = set()
    for line in page.read_text().splitlines():
        if m := re.match(r"^#+ (.+)$", line):
            ids.add(re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", m.group(1)).strip().lower()))
    return ids


def test_every_readme_link_resolves():
    readme = (REPO_ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert len(links) >= 15
    for target, anchor in links:
        path = REPO_ROOT / target
        assert path.is_file(), target
        assert not anchor or anchor in anchors(path), f"{target}#{anchor}"


def test_the_readme_is_a_front_door():
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    commands = ci_test_commands()
    assert len(commands) == 3 and commands[0].startswith("OMP_NUM_THREADS=1 python -m pytest"), commands
    development = (REPO_ROOT / "docs" / "development.md").read_text().splitlines()
    for command in commands:  # the README and the development guide show what CI runs
        assert command in lines and command in development, command


def ci_test_commands() -> list[str]:
    """The pytest commands of .ci/run, continuation lines joined, without their --basetemp (not those of
    the second environment, with the lowest supported versions, which docs/development.md describes)."""
    script = (REPO_ROOT / ".ci" / "run").read_text().replace("\\\n", "")
    script = script.split(". .venv-low/bin/activate")[0]
    return [
        re.sub(r"\s+", " ", re.sub(r' --basetemp="[^"]*"', "", line)).strip()
        for line in script.splitlines()
        if "python -m pytest" in line
    ]


def test_make_test_runs_the_readmes_unit_test_command():
    """``make test`` (the README's second command) runs the unit tests exactly as the README and CI do."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    unit = ci_test_commands()[0]
    assert unit.replace("python -m pytest", "$(PY) -m pytest") in makefile
    assert "make smoke" in (REPO_ROOT / "README.md").read_text().split("## Install")[0]


def test_the_guides_keep_their_size():
    """The developers' guide's limits: a guide that grows past them has become a log."""
    for page, most in (("performance.md", 200), ("development.md", 150)):
        lines = (REPO_ROOT / "docs" / page).read_text().splitlines()
        assert len(lines) <= most, f"docs/{page}: {len(lines)} lines, at most {most}"
