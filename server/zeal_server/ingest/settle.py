"""The store phase of ingest: one round of validated messages (``groups.Group``, each
(device, sequence) at most once) stored in the lock order of every collector: dedup rows
(``dedup``), then each stream's privacy ledger (``ledger``), then what the stored batches
add to the segments and device counters (``writes``, written at the end of the
transaction). Every message gets its outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import delete
from sqlalchemy.orm import Session

from zeal_server.ingest.groups import Group, Outcome
from zeal_server.store import dedup, ledger
from zeal_server.store.models import BatchSeen
from zeal_server.store.rawsql import Raw
from zeal_server.store.writes import Writes, collect

__all__ = ["Round"]

#: How a refusal is counted and told: (writes, (stream, device), reason, when=, sequence=).
Refuse = Callable[..., Outcome]


@dataclass
class Round:
    """One round's context: the session, its raw statements, the compiled single-row
    ``seen`` insert (for retries), how refusals are counted, and what it fills in."""

    session: Session
    raw: Raw
    seen: Callable[[], Any]
    refuse: Refuse
    outcomes: list[Outcome | None]
    writes: Writes

    def store(self, groups: list[Group]) -> None:
        """Store the round's groups: dedup rows, then the privacy ledger, then what the
        stored batches add."""
        if not groups:
            return
        rows = [g.seen_rows() for g in groups]
        went = dedup.insert(self.session, self.raw, np.concatenate(rows))
        generations: list[npt.NDArray[np.int64]] = []
        at = 0
        for seen in rows:
            fresh = went[at : at + len(seen)]
            at += len(seen)
            generation = np.where(fresh, 0, -1).astype(np.int64)  # -1: a duplicate
            taken = np.flatnonzero(~fresh)
            if taken.size:
                found = dedup.resolve(self.session, self.raw, seen[taken], self.seen)
                generation[taken] = [-1 if g is None else g for g in found]
            generations.append(generation)
        booked = [self._charge(g, gen >= 0) for g, gen in zip(groups, generations, strict=True)]
        for group, generation, charged in zip(groups, generations, booked, strict=True):
            self._settle(group, generation, charged)

    def _charge(self, group: Group, candidates: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
        """Which of the group's new batches the stream's privacy policy lets in."""
        daily, hourly = group.entry.params.readings_per_day, group.entry.params.readings_per_hour
        booked = candidates.copy()
        if daily is None or hourly is None or not candidates.any():
            return booked
        chosen = group.select(candidates)
        booked[candidates] = ledger.charge(
            self.session, self.raw, (daily, hourly), chosen.batches, chosen.device_ids
        )
        return booked

    def _settle(
        self, group: Group, generation: npt.NDArray[np.int64], stored: npt.NDArray[np.bool_]
    ) -> None:
        """Outcomes, device counters and segment parts of one group: `generation` of each
        batch (-1: a duplicate), `stored` whether it is in (within the policy)."""
        duplicate, reset = generation < 0, generation > 0
        counts = group.batches.counts
        counts_of, resets_of = counts.tolist(), reset.tolist()
        sequences = group.batches.sequences.tolist()
        signed = group.batches.sequences.view(np.int64).tolist()
        for k in np.flatnonzero((generation >= 0) & ~stored).tolist():  # over the policy
            self.session.execute(
                delete(BatchSeen).where(
                    BatchSeen.device_id == int(group.device_ids[k]),
                    BatchSeen.sequence == signed[k],
                    BatchSeen.generation == int(generation[k]),
                )
            )
            names, when = (group.stream, group.names[k]), int(group.received[k])
            self.outcomes[group.positions[k]] = self.refuse(
                self.writes, names, "over_budget", when=when, sequence=sequences[k]
            )
        for k in np.flatnonzero(duplicate).tolist():
            self.outcomes[group.positions[k]] = Outcome(
                "duplicate", None, group.stream, group.names[k], 0, sequences[k]
            )
        lasts = self._last_sequences(group, generation, reset & stored)
        stream, outcomes, new = group.stream, self.outcomes, tuple.__new__
        for k in np.flatnonzero(stored).tolist():  # a tuple each, without Outcome's __new__
            outcomes[group.positions[k]] = new(
                Outcome,
                ("stored", None, stream, group.names[k], counts_of[k], sequences[k],
                 resets_of[k], lasts.get(k)),
            )  # fmt: skip
        self.writes.count_devices(
            group.device_ids,
            [
                group.received,
                np.where(stored, counts, 0),
                stored,
                np.where(stored, group.sizes, 0),
                duplicate,
                reset,
            ],
        )
        chosen = group.select(stored)
        collect(group.entry, chosen.batches, chosen.device_ids, self.writes)

    def _last_sequences(
        self, group: Group, generation: npt.NDArray[np.int64], resets: npt.NDArray[np.bool_]
    ) -> dict[int, int | None]:
        """For each stored reset: the highest sequence stored from its device at that
        point of a one-by-one ingest."""
        out: dict[int, int | None] = {}
        signed = group.batches.sequences.view(np.int64)
        for k in np.flatnonzero(resets).tolist():
            device = group.device_ids[k]
            later = {
                (int(signed[j]), int(generation[j]))
                for j in range(k + 1, len(group.positions))
                if group.device_ids[j] == device and generation[j] >= 0
            }
            out[k] = dedup.last_sequence(self.session, int(device), later)
        return out
