"""Agents started together on one data directory (the README's two kitchens) each open
the outbox file, new or of an older release, without one failing: the journal mode and
the columns an older outbox lacks are set by one process at a time. The README's
walkthrough once lost its first agent to "duplicate column name: instance"."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from zeal_edge.outbox import Outbox

PROCESSES = 4
ROUNDS = 10


def _open(path: str, barrier: Any) -> None:
    barrier.wait(30)
    Outbox(Path(path)).close()


def test_processes_opening_one_new_outbox_together_all_succeed(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    failed = []
    for round_ in range(ROUNDS):
        path = tmp_path / str(round_) / "outbox.sqlite"
        barrier = context.Barrier(PROCESSES)
        processes = [
            context.Process(target=_open, args=(str(path), barrier)) for _ in range(PROCESSES)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(60)
        failed += [(round_, p.exitcode) for p in processes if p.exitcode != 0]
    assert failed == []
