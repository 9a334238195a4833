"""The documentation: the generated reference page equals what the code generates, and every link of the
README (the front door, outside the MkDocs site, which `mkdocs build --strict` checks in CI) resolves."""

from __future__ import annotations

import re
from pathlib import Path

from clsr.study.reference import reference_markdown

REPO_ROOT = Path(__file__).resolve().parents[1]


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
    for command in (  # .ci/run runs them
        'OMP_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider --durations=10 -n 2 -m "not e2e" tests',
        "python -m pytest -q -p no:cacheprovider --durations=30 -m e2e tests",
    ):
        assert command in lines, command
