"""A device's sequence state (zeal_server.store.sequences) against a plain set of what was
stored, over seeded random arrival orders: which sequences are new, what is late, what is
counted missing, and its bytes."""

from __future__ import annotations

import numpy as np
import pytest

from zeal.protocol import MAX_SEQUENCE, MAX_SEQUENCE_JUMP
from zeal_server.store.sequences import RECENT, WINDOW, SequenceState

MAX_BYTES = 5 * 8 + RECENT * 16 + WINDOW // 8


def stored_bytes(state: SequenceState) -> int:
    values = state.values()
    blobs = sum(len(values[k] or b"") for k in ("bits", "recent"))
    return 5 * 8 + blobs


@pytest.mark.parametrize("seed", range(20))
def test_the_state_answers_what_a_set_of_every_stored_sequence_answers(seed: int) -> None:
    """Sequences 0..n-1, some withheld, the rest arriving shuffled within a bounded
    distance of their place (and some sent twice): a sequence is new exactly when the set
    does not hold it (while the head has not run WINDOW past it), late exactly when a
    higher one came before, and at the end the missing count is the withheld ones."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 2000))
    withheld = set(rng.choice(n, size=int(rng.integers(0, n // 10 + 1)), replace=False).tolist())
    order = np.argsort(np.arange(n) + rng.uniform(0, 40, n))  # displaced by up to ~40
    arrivals = [int(s) for s in order if int(s) not in withheld]
    state, stored, late, head = SequenceState(), set(), 0, -1
    for sequence in arrivals:
        for _ in range(1 + int(rng.random() < 0.1)):  # a redelivery now and then
            if sequence in stored:
                assert not state.is_new(sequence)
                continue
            assert state.is_new(sequence)
            late += sequence < head
            assert state.store(sequence, sequence * 7, 1000 + sequence) == (sequence < head)
            stored.add(sequence)
            head = max(head, sequence)
        assert stored_bytes(state) <= MAX_BYTES
    assert state.late == late
    assert state.head == max(arrivals)
    state.settle()
    below_head = {s for s in withheld if s < max(arrivals)}
    assert state.missing == len(below_head)
    assert state.gaps() == 0
    assert state.floor == max(arrivals) + 1


def test_a_round_trip_through_the_columns_keeps_everything() -> None:
    state = SequenceState()
    for sequence in (0, 1, 2, 5, 9, 2**64 - 1 - 2**40, 3, 1000):
        state.store(sequence, -(sequence % 2**62), sequence % 1000)
    row = state.values()
    again = SequenceState.from_row(
        [row[k] for k in ("floor", "head", "bits", "recent", "newest", "missing", "late")]
    )
    assert again == state
    assert state.recent_digest(3, -3)
    assert not state.recent_digest(3, 3)


def test_in_order_the_state_is_its_integers_and_four_digests() -> None:
    state = SequenceState()
    for sequence in range(10_000):
        state.store(sequence, sequence, sequence)
    assert (state.floor, state.head, state.bits, state.missing, state.late) == (
        10_000,
        9_999,
        0,
        0,
        0,
    )
    assert stored_bytes(state) == 5 * 8 + RECENT * 16


def test_a_jump_is_remembered_but_moves_nothing_and_counts_nothing_missing() -> None:
    """A device that jumps from 9 to 2**63 - 1 and to 2**64 - 1 (hostile, or broken): both
    are jumps (MAX_SEQUENCE_JUMP), kept among the recent digests only; nothing is counted
    missing, and its next honest batch, 10, is new and not late. Before: the jump counted
    2**63 - 1 sequences missing and made every later honest batch a reset."""
    state = SequenceState()
    for sequence in range(10):
        state.store(sequence, sequence, sequence)
    for sequence in (2**63 - 1, 2**64 - 1):
        assert state.jumps(sequence)
        assert state.store(sequence, 1, 10) is False
    assert (state.floor, state.head, state.bits, state.missing) == (10, 9, 0, 0)
    assert state.recent_digest(2**64 - 1, 1)
    assert not state.jumps(10)
    assert state.is_new(10)
    assert state.store(10, 10, 11) is False
    assert (state.head, state.missing, state.late) == (10, 0, 0)
    assert stored_bytes(state) <= MAX_BYTES


def test_the_bound_of_a_continuation_is_max_sequence_jump_above_the_head() -> None:
    """From head 9, 9 + MAX_SEQUENCE_JUMP continues (the sequences between counted missing
    once the window passes them); one more is a jump. A new device's first batch may be
    at most MAX_SEQUENCE_JUMP - 1."""
    state = SequenceState()
    for sequence in range(10):
        state.store(sequence, sequence, sequence)
    assert state.jumps(9 + MAX_SEQUENCE_JUMP + 1)
    assert not state.jumps(9 + MAX_SEQUENCE_JUMP)
    state.store(9 + MAX_SEQUENCE_JUMP, 0, 10)
    assert state.head == 9 + MAX_SEQUENCE_JUMP
    assert state.missing == MAX_SEQUENCE_JUMP - WINDOW
    assert SequenceState().jumps(MAX_SEQUENCE_JUMP)
    assert not SequenceState().jumps(MAX_SEQUENCE_JUMP - 1)


def test_a_device_that_renumbered_is_followed_from_its_second_batch() -> None:
    """A jump to 1,000,000, then 1,000,002 (one lost between): the second continues the
    jump, so the state re-bases there; 1,000,001 is counted missing once the window passes
    it, and the old gaps below 9 are given up as missing too."""
    state = SequenceState()
    for sequence in (0, 1, 2, 4, 5, 6, 7, 8, 9):
        state.store(sequence, sequence, sequence)
    assert state.jumps(1_000_000)
    state.store(1_000_000, 1, 10)
    assert not state.jumps(1_000_002)
    state.store(1_000_002, 2, 11)
    assert state.head == 1_000_002
    assert state.missing == 1  # sequence 3
    state.settle()
    assert state.missing == 2  # and 1,000,001
    assert not state.is_new(1_000_000)
    assert state.is_new(1_000_003)


def test_past_max_sequence_nothing_continues() -> None:
    """Sequences past MAX_SEQUENCE (an agent cannot store them) are jumps, even right after
    a jump; a state re-based up to MAX_SEQUENCE keeps its columns."""
    state = SequenceState()
    state.store(0, 0, 0)
    state.store(MAX_SEQUENCE - 1, 1, 1)
    state.store(MAX_SEQUENCE, 2, 2)
    assert state.head == MAX_SEQUENCE
    assert state.jumps(MAX_SEQUENCE + 1)
    row = state.values()
    again = SequenceState.from_row(
        [row[k] for k in ("floor", "head", "bits", "recent", "newest", "missing", "late")]
    )
    assert again == state
