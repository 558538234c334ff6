"""What the agent's commands say is true: no promise of lines that are not printed, no
"confirmed" when nothing was sent, a hint where a first file goes wrong."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tools.testbed.broker import agent_status_text
from zeal_edge.outbox import Outbox
from zeal_edge.sources import CsvSource

ROOT = Path(__file__).resolve().parents[2]


def test_a_csv_without_a_header_row_says_how_to_name_the_column(tmp_path: Path) -> None:
    """Before: only 'has no column temp (columns: 50.1)'."""
    path = tmp_path / "bare.csv"
    path.write_text("50.1\n51.2\n")
    with pytest.raises(ValueError, match=r"it has no header row: add one .* --column"):
        CsvSource(path, column="temp")
    named = tmp_path / "named.csv"
    named.write_text("when,value\n1,50.1\n")
    with pytest.raises(ValueError, match=r"its first row: when, value\); name the column"):
        CsvSource(named, column="temp")


def test_status_promises_no_lines_it_does_not_print(tmp_path: Path) -> None:
    """Before: 'the server reports rejects below', with nothing below."""
    outbox = Outbox(tmp_path / "outbox.sqlite")
    outbox.ensure("temps", "dev1")
    outbox.close()
    text = agent_status_text(tmp_path)
    assert "below" not in text, text
    assert "server rejected" not in text, text  # nothing sent: nothing to reject


def test_the_firmware_profile_the_docs_write_is_ignored_by_git() -> None:
    """docs/firmware.md writes profile.hex at the repository's top (a device's key)."""
    assert "> profile.hex" in (ROOT / "docs" / "firmware.md").read_text()
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "profile.hex"], cwd=ROOT, check=False
    ).returncode
    assert ignored == 0
