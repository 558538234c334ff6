"""How a benchmark ends: its figures written as JSON where asked, and exit status 1 with
the targets it missed."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["finish"]


def finish(results: object, missed: list[str], out: Path | None) -> int:
    """Write `results` to `out` (if given); print the misses; the exit status."""
    if out is not None:
        out.write_text(json.dumps(results, indent=2) + "\n")
    if missed:
        print(f"MISSED: {missed}")
        return 1
    return 0
