"""A device's sequence state (zeal_server.store.sequences) against a plain set of what was
stored, over seeded random arrival orders: which sequences are new, what is late, what is
counted missing, and its bytes."""

from __future__ import annotations

import numpy as np
import pytest

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
    for sequence in (0, 1, 2, 5, 9, 2**64 - 1 - 2**40, 3):
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


def test_a_jump_to_the_last_sequence_costs_nothing_and_counts_what_it_skipped() -> None:
    """A device that jumps from 9 to 2**64 - 1 (hostile, or broken): the bitmap never grows
    past the window, the skipped sequences are counted (saturating at a BIGINT), and a
    second such jump keeps the count where a BIGINT holds it."""
    state = SequenceState()
    for sequence in range(10):
        state.store(sequence, sequence, sequence)
    state.store(2**64 - 1, 1, 10)
    assert state.bits.bit_length() <= WINDOW
    assert state.missing == 2**63 - 1
    assert stored_bytes(state) <= MAX_BYTES
    row = state.values()
    again = SequenceState.from_row(
        [row[k] for k in ("floor", "head", "bits", "recent", "newest", "missing", "late")]
    )
    assert not again.is_new(2**64 - 1)
    assert not again.is_new(5)
    assert again.store(2**64 - 2, 2, 11)  # late
