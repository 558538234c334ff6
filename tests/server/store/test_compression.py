"""Store compression on real data against the entropy and the paper's baselines ."""

from __future__ import annotations

import pytest

from bench.store_compression import measure


@pytest.mark.slow
def test_store_is_near_entropy_and_far_below_float64() -> None:
    """100,000+ Seattle readings at 6 bits: codes column <= 1.05x entropy, segment <= 1.25x,
    >= 8x smaller than zstd on plain PM float64, codes <= zstd on privatized float64."""
    m = measure(readings=105_120)
    print({k: round(v, 4) for k, v in m.items()})
    assert m["readings"] >= 100_000
    assert m["codes"] <= 1.05 * m["entropy"]
    assert m["segment"] <= 1.25 * m["entropy"]
    assert m["pm_float64_zstd"] >= 8 * m["segment"]
    assert m["codes"] <= m["privatized_float64_zstd"]
