"""The store phase of ingest: one round of validated messages (``groups.Group``, each
(device, sequence) at most once) stored in the lock order of every collector: the devices'
sequence states (``Sequences``: read and locked once per transaction, which batch is new,
a redelivery or after a reset), then each stream's privacy ledger (``ledger``), then what
the stored batches add to the segments and device rows (``writes``, written at the end of
the transaction). Every message gets its outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from sqlalchemy.orm import Session

from zeal_server.ingest.groups import Group, Outcome
from zeal_server.store import ledger, sequences
from zeal_server.store.rawsql import Raw
from zeal_server.store.writes import Writes, collect

__all__ = ["DUPLICATE", "NEW", "RESET", "Round", "Sequences"]

#: Refusal counter and outcome: (writes, (stream, device), reason, when=, sequence=).
Refuse = Callable[..., Outcome]
#: What a batch is to its device's sequences (``Sequences.kind``).
DUPLICATE, NEW, RESET = -1, 0, 1


class Sequences:
    """A transaction's view of its devices' sequences: their states (``writes.states``,
    read and locked once, before anything else is written), the batches stored in this
    transaction (not in the segments yet), and the store's own answer for a sequence used
    before (``sequences.Holdings``)."""

    def __init__(self, session: Session, writes: Writes, groups: list[Group]) -> None:
        wanted = {int(d) for g in groups for d in g.device_ids.tolist()} - set(writes.states)
        writes.states.update(sequences.load(session, wanted))
        self.states = writes.states
        self.here: dict[tuple[int, int], set[int]] = {}
        self.holdings = sequences.Holdings(session)

    def kind(self, group: Group, k: int) -> int:
        """What batch `k` of the group is: NEW (its sequence never stored), DUPLICATE (its
        content stored before) or RESET (its sequence stored before with other content)."""
        device, sequence = int(group.device_ids[k]), int(group.batches.sequences[k])
        digest = int(group.digests[k])
        if digest in self.here.get((device, sequence), ()):
            return DUPLICATE
        state = self.states.setdefault(device, sequences.SequenceState())  # deleted meanwhile
        if state.recent_digest(sequence, digest):
            return DUPLICATE
        if state.is_new(sequence):
            return NEW
        starts = group.batches.starts
        readings = slice(int(starts[k]), int(starts[k + 1]))
        held = self.holdings.holds(
            group.entry.id,
            device,
            group.batches.timestamps[readings],
            group.batches.codes[readings],
        )
        return DUPLICATE if held else RESET

    def store(self, group: Group, k: int, reset: bool) -> int:
        """Record stored batch `k`: its device's highest sequence then."""
        device, sequence = int(group.device_ids[k]), int(group.batches.sequences[k])
        digest = int(group.digests[k])
        first_ms = int(group.batches.timestamps[group.batches.starts[k]])
        state = self.states.setdefault(device, sequences.SequenceState())
        state.store(sequence, digest, first_ms, reset=reset)
        self.here.setdefault((device, sequence), set()).add(digest)
        assert state.head is not None
        return state.head


@dataclass
class Round:
    """One round's context: the session, its raw statements, the transaction's sequences,
    how refusals are counted, and what it fills in."""

    session: Session
    raw: Raw
    sequences: Sequences
    refuse: Refuse
    outcomes: list[Outcome | None]
    writes: Writes

    def store(self, groups: list[Group]) -> None:
        """Store the round's groups: what each batch is, then the privacy ledger, then
        what the stored batches add."""
        if not groups:
            return
        kinds = [
            np.array([self.sequences.kind(g, k) for k in range(len(g.positions))], dtype=np.int64)
            for g in groups
        ]
        booked = [self._charge(g, kind >= 0) for g, kind in zip(groups, kinds, strict=True)]
        for group, kind, charged in zip(groups, kinds, booked, strict=True):
            self._settle(group, kind, charged)

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
        self, group: Group, kind: npt.NDArray[np.int64], stored: npt.NDArray[np.bool_]
    ) -> None:
        """Outcomes, device counters and segment parts of one group: `kind` of each batch
        (Sequences.kind), `stored` whether it is in (within the policy)."""
        duplicate, reset = kind == DUPLICATE, kind == RESET
        counts = group.batches.counts
        counts_of, resets_of = counts.tolist(), reset.tolist()
        sequences_of = group.batches.sequences.tolist()
        for k in np.flatnonzero((kind != DUPLICATE) & ~stored).tolist():  # over the policy
            names, when = (group.stream, group.names[k]), int(group.received[k])
            self.outcomes[group.positions[k]] = self.refuse(
                self.writes, names, "over_budget", when=when, sequence=sequences_of[k]
            )
        for k in np.flatnonzero(duplicate).tolist():
            self.outcomes[group.positions[k]] = Outcome(
                "duplicate", None, group.stream, group.names[k], 0, sequences_of[k]
            )
        stream, outcomes, new = group.stream, self.outcomes, tuple.__new__
        for k in np.flatnonzero(stored).tolist():  # a tuple each, without Outcome's __new__
            last = self.sequences.store(group, k, resets_of[k])
            outcomes[group.positions[k]] = new(
                Outcome,
                ("stored", None, stream, group.names[k], counts_of[k], sequences_of[k],
                 resets_of[k], last if resets_of[k] else None),
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
