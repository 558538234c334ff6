"""Random words for the samplers: the operating system's CSPRNG unless a generator is injected.

Tests pass a seeded :class:`numpy.random.Generator`; production code passes nothing and gets
``os.urandom`` (getrandom(2) on Linux), a cryptographically secure source.
"""

from __future__ import annotations

import os

import numpy as np
import numpy.typing as npt

__all__ = ["Randomness", "random_words", "uniform01", "uniform_below"]

Randomness = np.random.Generator | None


def random_words(rng: Randomness, n: int) -> npt.NDArray[np.uint64]:
    """n independent uniform 64-bit words."""
    if rng is None:
        return np.frombuffer(bytearray(os.urandom(8 * n)), dtype=np.uint64)
    return rng.bit_generator.random_raw(n).astype(np.uint64, copy=False)


def uniform_below(rng: Randomness, bound: int, n: int) -> npt.NDArray[np.int64]:
    """n independent integers uniform on [0, bound), exactly (rejection sampling).

    Draws bit_length(bound) bits per try and rejects values >= bound, so each try succeeds
    with probability above 1/2 and the result has no modulo bias.
    """
    if not 0 < bound < 1 << 63:
        raise ValueError(f"bound must be in (0, 2**63), got {bound}")
    mask = np.uint64((1 << bound.bit_length()) - 1)
    limit = np.uint64(bound)
    out = random_words(rng, n) & mask
    todo = np.flatnonzero(out >= limit)
    while todo.size:
        redraw = random_words(rng, todo.size) & mask
        out[todo] = redraw
        todo = todo[redraw >= limit]
    return out.astype(np.int64)


def uniform01(rng: Randomness, n: int) -> npt.NDArray[np.float64]:
    """n uniforms on [0, 1): the top 53 bits of random words, scaled exactly."""
    return (random_words(rng, n) >> np.uint64(11)).astype(np.float64) * 2.0**-53
