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
from typing import Protocol

import numpy as np
import numpy.typing as npt
from sqlalchemy.orm import Session

from zeal.policy import DeviceCaps, micro_epsilon
from zeal.wirebatches import Batches
from zeal_server.ingest.groups import Group, Outcome, select_batches
from zeal_server.ingest.memo import Seen, fresh_batches, read_seen, remember
from zeal_server.store import ledger, sequences
from zeal_server.store.rawsql import Raw
from zeal_server.store.writes import Writes, collect

__all__ = ["DUPLICATE", "JUMP", "NEW", "RESET", "SEQUENCE_JUMP", "Round", "Sequences"]


class Refuse(Protocol):
    """How a round refuses a message: the reject counted in `writes` under (stream,
    device) and `reason`, and the message's outcome."""

    def __call__(
        self,
        writes: Writes,
        names: tuple[str, str],
        reason: str,
        *,
        when: int,
        sequence: int | None = None,
    ) -> Outcome: ...


#: The device caps of accounts (store.budgets.Account): (principal id, caps in
#: micro-epsilon or None).
Caps = Callable[[list[tuple[str, str]]], dict[tuple[str, str], tuple[int, DeviceCaps | None]]]
#: What a batch is to its device's sequences (``Sequences.kind``).
DUPLICATE, NEW, RESET, JUMP = -1, 0, 1, 2
#: The outcome's reason of a batch stored as a jump (``store.sequences``).
SEQUENCE_JUMP = "sequence_jump"


class Sequences:
    """A transaction's view of its devices' sequences: their states (``writes.states``,
    read and locked once, before anything else is written), the batches stored in this
    transaction (not in the segments yet), and the store's own answer for a sequence used
    before (``sequences.Holdings``)."""

    def __init__(
        self, session: Session, writes: Writes, groups: list[Group], rounds: int = 1
    ) -> None:
        wanted = {int(d) for g in groups for d in g.device_ids.tolist()} - set(writes.states)
        writes.states.update(sequences.load(session, wanted))
        self.states = writes.states
        #: (device, sequence, digest) of the batches stored in this transaction, kept when
        #: it has more than one round (``groups.rounds``: a device's sequence repeated).
        self.rounds = rounds
        self.here: set[tuple[int, int, int]] = set()
        self.holdings = sequences.Holdings(session)
        #: The groups of this round with no batch beyond its device's sequence (by id).
        self._within: set[int] = set()

    def _state(self, device: int) -> sequences.SequenceState:
        return self.states.setdefault(device, sequences.SequenceState())  # deleted meanwhile

    def _beyond(self, group: Group) -> npt.NDArray[np.bool_]:
        """Which batches of the group lie beyond what continues their device's sequence
        (``SequenceState.limit``): jumps, or the continuation of a recent one."""
        found, inverse = np.unique(group.device_ids, return_inverse=True)
        limits = np.array([self._state(d).limit() for d in found.tolist()], dtype=np.uint64)
        beyond: npt.NDArray[np.bool_] = group.batches.sequences > limits[inverse]
        return beyond

    def split_jumps(self, groups: list[Group]) -> tuple[list[Group], list[Group]]:
        """The groups for this round, and what waits for the next: a device's batch beyond
        its sequence (``_beyond``) is the last of the device's batches in the round, and
        waits itself unless it is the first. Whether it is a jump depends on what the
        earlier ones stored (the head they moved, the jump they made), and what the later
        ones are on where it leaves the device (a re-based sequence), so each is decided on
        the state the ones before leave, as one at a time would."""
        now, later = [], []
        self._within.clear()
        for group in groups:
            beyond = self._beyond(group)
            if not beyond.any():
                self._within.add(id(group))
                now.append(group)
                continue
            devices = group.device_ids.tolist()
            waiting = np.zeros(len(devices), dtype=bool)
            seen: set[int] = set()
            closed: set[int] = set()  # devices whose later batches wait
            for k, device in enumerate(devices):
                if device in closed or (beyond[k] and device in seen):
                    waiting[k] = True
                if beyond[k]:
                    closed.add(device)
                seen.add(device)
            if not waiting.any():
                now.append(group)
                continue
            now.append(group.select(~waiting))
            later.append(group.select(waiting))
        if later:
            self.rounds = max(self.rounds, 2)
        return [g for g in now if g.positions], later

    def kinds(self, group: Group) -> npt.NDArray[np.int64]:
        """What each batch of the group is (``kind``): NEW at once for a sequence above its
        device's highest and within reach of it (most batches), the others one by one."""
        found, inverse = np.unique(group.device_ids, return_inverse=True)
        states = [self._state(d) for d in found.tolist()]
        heads = np.array([s.head or 0 for s in states], dtype=np.uint64)
        fresh = np.array([s.head is None for s in states], dtype=bool)
        above = fresh[inverse] | (group.batches.sequences > heads[inverse])
        if id(group) not in self._within:  # split_jumps found none beyond in it
            above &= ~self._beyond(group)
        out = np.full(len(group.positions), NEW, dtype=np.int64)
        for k in np.flatnonzero(~above).tolist():
            out[k] = self.kind(group, k)
        return out

    def kind(self, group: Group, k: int) -> int:
        """What batch `k` of the group is: NEW (its sequence never stored), DUPLICATE (its
        content stored before), RESET (its sequence stored before with other content) or
        JUMP (beyond the device's sequence, ``store.sequences``; a jump sent again is a
        DUPLICATE)."""
        device, sequence = int(group.device_ids[k]), int(group.batches.sequences[k])
        digest = int(group.digests[k])
        if (device, sequence, digest) in self.here:
            return DUPLICATE
        state = self._state(device)
        if state.recent_digest(sequence, digest):
            return DUPLICATE
        jump = state.jumps(sequence)
        if not jump and state.is_new(sequence):
            return NEW
        starts = group.batches.starts
        readings = slice(int(starts[k]), int(starts[k + 1]))
        held = self.holdings.holds(
            group.entry.id,
            device,
            group.batches.timestamps[readings],
            group.batches.codes[readings],
        )
        if held:
            return DUPLICATE
        return JUMP if jump else RESET

    def store(
        self, group: Group, stored: npt.NDArray[np.int64], kinds: npt.NDArray[np.int64]
    ) -> dict[int, int | None]:
        """Record the group's stored batches `stored` (indices, in message order; their
        `kinds` beside them): for each reset and jump, its device's highest sequence then.
        A device whose batches continue its sequence without a gap is updated at once."""
        if not stored.size:
            return {}
        devices = group.device_ids[stored]
        chosen = group.batches.sequences[stored]
        digests = group.digests[stored]
        firsts = group.batches.timestamps[group.batches.starts[:-1][stored]]
        if self.rounds > 1:  # a later round may hold one of these again
            self.here.update(zip(devices.tolist(), chosen.tolist(), digests.tolist(), strict=True))
        order = np.argsort(devices, kind="stable")
        found, starts = np.unique(devices[order], return_index=True)
        lasts: dict[int, int | None] = {}
        for device, run in zip(found.tolist(), np.split(order, starts[1:]), strict=True):
            state, mine = self._state(device), chosen[run]
            if (kinds[run] == NEW).all() and state.continued_by(mine):
                state.extend(mine, digests[run], int(firsts[run].max()))
                continue
            for i in run.tolist():
                kind = int(kinds[i])
                state.store(int(chosen[i]), int(digests[i]), int(firsts[i]), reset=kind == RESET)
                if kind in (RESET, JUMP):
                    lasts[int(stored[i])] = state.head
        return lasts


def _principals(
    group: Group, found: dict[tuple[str, str], tuple[int, DeviceCaps | None]]
) -> npt.NDArray[np.int64]:
    """The principal of each of the group's batches (-1 where no cap applies): by device
    id, once per device, when each device spends its own account."""
    if group.accounts is not None:
        return np.array(
            [i if cap is not None else -1 for i, cap in map(found.__getitem__, group.accounts)],
            dtype=np.int64,
        )
    _, first, inverse = np.unique(group.device_ids, return_index=True, return_inverse=True)
    owners = [found[(group.names[k], "")] for k in first.tolist()]
    ids = np.array([i if cap is not None else -1 for i, cap in owners], dtype=np.int64)
    return ids[inverse]


@dataclass(kw_only=True)
class Round:
    """One round's context: the session, its raw statements, the transaction's sequences,
    how refusals are counted, and what it fills in."""

    session: Session
    raw: Raw
    sequences: Sequences
    refuse: Refuse
    outcomes: list[Outcome | None]
    writes: Writes
    #: The device caps across streams (None: none applies).
    caps: Caps | None = None

    def store(self, groups: list[Group]) -> list[Group]:
        """Store the round's groups: what each batch is, then the privacy ledgers (every
        stream's, then the devices' caps across streams), then what the stored batches
        add. Returns what waits for another round (``Sequences.split_jumps``)."""
        groups, later = self.sequences.split_jumps(groups)
        if not groups:
            return later
        kinds = [self.sequences.kinds(g) for g in groups]
        candidates = [kind >= 0 for kind in kinds]
        priced = [self._priced(g) for g in groups]
        booked = [
            self._charge(g, c, p[1]) for g, c, p in zip(groups, candidates, priced, strict=True)
        ]
        capped = self._cap(groups, candidates, booked, [p[1] for p in priced])
        for group, kind, charged, refused, (seen, _) in zip(
            groups, kinds, booked, capped, priced, strict=True
        ):
            self._settle(group, kind, charged, refused)
            if seen is not None:
                stored = (kind >= 0) & charged
                remember(self.session, group.batches, group.device_ids, stored, seen)
        return later

    def _priced(self, group: Group) -> tuple[Seen | None, Batches]:
        """The readings of the group's batches that cost: every one, but on a longitudinal
        stream only those whose code is new for its device (ingest.memo), with the
        devices' codes seen so far."""
        params = group.entry.params
        if params.grid_points is None or params.readings_per_day is None:
            return None, group.batches
        seen = read_seen(self.session, group.device_ids, params.payload_bits)
        return seen, fresh_batches(group.batches, group.device_ids, seen)

    def _cap(
        self,
        groups: list[Group],
        candidates: list[npt.NDArray[np.bool_]],
        booked: list[npt.NDArray[np.bool_]],
        priced: list[Batches],
    ) -> list[npt.NDArray[np.bool_]]:
        """Book the batches the streams let in on their devices' caps across streams
        (streams with a policy only): which were refused there (``booked`` is updated)."""
        capped = [np.zeros(len(b), dtype=bool) for b in booked]
        policed = [g.entry.params.readings_per_day is not None for g in groups]
        wanted: set[tuple[str, str]] = set()
        for group, p in zip(groups, policed, strict=True):
            if not p:
                continue
            if group.accounts is None:  # its devices' own accounts, once per device
                wanted.update((n, "") for n in set(group.names))
            else:
                wanted.update(group.accounts)
        if self.caps is None or not wanted:
            return capped
        found = self.caps(sorted(wanted))
        limits = {pid: cap for pid, cap in found.values() if cap is not None}
        if not limits:
            return capped
        charges: list[ledger.DeviceCharge | None] = []
        for group, chosen, charged, p, costly in zip(
            groups, candidates, booked, policed, priced, strict=True
        ):
            params = group.entry.params
            if not p or params.readings_per_hour is None or not chosen.any():
                charges.append(None)
                continue
            charges.append(
                ledger.DeviceCharge(
                    group.stream + "/",
                    group.positions,
                    _principals(group, found),
                    group.device_ids,
                    costly,
                    (params.readings_per_day, params.readings_per_hour),  # type: ignore[arg-type]
                    micro_epsilon(params.epsilon),
                    chosen,
                    charged,
                )
            )
        ledger.charge_devices(self.session, self.raw, [c for c in charges if c is not None], limits)
        return [c.capped if c is not None else z for c, z in zip(charges, capped, strict=True)]

    def _charge(
        self, group: Group, candidates: npt.NDArray[np.bool_], costly: Batches
    ) -> npt.NDArray[np.bool_]:
        """Which of the group's new batches the stream's privacy policy lets in (`costly`:
        the group's batches with the readings that cost)."""
        daily, hourly = group.entry.params.readings_per_day, group.entry.params.readings_per_hour
        booked = candidates.copy()
        if daily is None or hourly is None or not candidates.any():
            return booked
        booked[candidates] = ledger.charge(
            self.session,
            self.raw,
            (daily, hourly),
            select_batches(costly, candidates),
            group.device_ids[candidates],
        )
        return booked

    def _settle(
        self,
        group: Group,
        kind: npt.NDArray[np.int64],
        stored: npt.NDArray[np.bool_],
        capped: npt.NDArray[np.bool_],
    ) -> None:
        """Outcomes, device counters and segment parts of one group: `kind` of each batch
        (Sequences.kind), `stored` whether it is in (within the policies), `capped` whether
        its device's cap across streams refused it."""
        duplicate, reset, jump = kind == DUPLICATE, kind >= RESET, kind == JUMP
        counts = group.batches.counts
        counts_of, resets_of = counts.tolist(), reset.tolist()
        sequences_of = group.batches.sequences.tolist()
        for k in np.flatnonzero((kind != DUPLICATE) & ~stored).tolist():  # over a policy
            names, when = (group.stream, group.names[k]), int(group.received[k])
            reason = "device_cap" if capped[k] else "over_budget"
            self.outcomes[group.positions[k]] = self.refuse(
                self.writes, names, reason, when=when, sequence=sequences_of[k]
            )
        for k in np.flatnonzero(duplicate).tolist():
            self.outcomes[group.positions[k]] = Outcome(
                "duplicate", None, group.stream, group.names[k], 0, sequences_of[k]
            )
        stream, outcomes, new = group.stream, self.outcomes, tuple.__new__
        kept = np.flatnonzero(stored)
        lasts = self.sequences.store(group, kept, kind[kept])
        for k in kept.tolist():  # a tuple each, without Outcome's __new__
            outcomes[group.positions[k]] = new(
                Outcome,
                ("stored", None, stream, group.names[k], counts_of[k], sequences_of[k],
                 resets_of[k], None),
            )  # fmt: skip
        for k, last in lasts.items():
            position = group.positions[k]
            why = SEQUENCE_JUMP if jump[k] else None
            outcomes[position] = outcomes[position]._replace(  # type: ignore[union-attr]
                reason=why, last_sequence=last
            )
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
