"""The docs refer to nothing outside the repository: links resolve, no stray references."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
OUTSIDE = re.compile(r"\.\./shared|DESIGN\.md|STYLE\.md|\bissues? \d+\b|closing note")


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / line for line in out.splitlines()]


def test_every_relative_link_in_the_docs_resolves() -> None:
    """Each [text](path) of a tracked Markdown file names a file or folder of the repository."""
    broken = []
    for doc in tracked("*.md"):
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (doc.parent / target.split("#")[0]).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert broken == []


def test_nothing_points_outside_the_repository() -> None:
    """No doc or module points at ../shared, the design notes or the issue tracker, which a
    reader of the repository does not have."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in tracked("*.md", "*.py", "Makefile", "*.yml", "deploy/*")
        if path.name != "test_docs.py"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert found == []
