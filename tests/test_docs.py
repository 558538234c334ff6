"""The docs refer to nothing outside the repository: links resolve, no stray references."""

from __future__ import annotations

import importlib
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


#: A path of the repository in backquotes: a top-level folder, then more (no glob, no
#: placeholder, no command line).
REPO_PATH = re.compile(r"`((?:edge|server|shared|deploy|tests|bench|tools|docs|data)/[\w./-]*)`")
#: A module or a name in one of the three packages, in backquotes.
DOTTED = re.compile(r"`((?:zeal|zeal_edge|zeal_server)(?:\.[A-Za-z_]\w*)+)`")


def _resolves(dotted: str) -> bool:
    """Whether `dotted` is a module of the packages, or a name defined in one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def test_the_readme_names_files_and_modules_that_exist() -> None:
    """Every repository path and every module or name of the three packages the README
    gives in backquotes exists (a moved module otherwise leaves the README pointing at
    nothing)."""
    text = (ROOT / "README.md").read_text()
    paths = set(REPO_PATH.findall(text))
    missing = sorted(p for p in paths if not (ROOT / p.rstrip("/")).exists())
    names = set(DOTTED.findall(text))
    unknown = sorted(n for n in names if not _resolves(n))
    assert len(paths) > 10  # the patterns see the README's references
    assert len(names) > 5
    assert (missing, unknown) == ([], [])
