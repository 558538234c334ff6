"""Longitudinal streams (zeal.longitudinal): the rounding is unbiased over the offset, the
memo repeats its codes and books only draws, the accounting holds exactly on small grids,
the planner's draws are the simulated ones, and the device-level interval covers on fleets
like a real one (homes that differ, missing hours) where the reading-level one does not."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.helpers import load_temps
from zeal import Zeal
from zeal.errors import ParameterError, ZealWarning
from zeal.longitudinal import (
    Memo,
    audit_memo,
    clustered_estimate,
    draw_offset,
    grid_indices,
    grid_values,
    plan_grid,
    simulate_fleet,
)
from zeal.mqtt.streamconfig import config_document, params_from_config

PARAMS = Zeal(lower=0, upper=110, epsilon=1, grid_points=12)


def test_the_grid_is_part_of_the_fingerprint_and_the_configuration() -> None:
    plain = Zeal(lower=0, upper=110, epsilon=1)
    assert PARAMS.fingerprint != plain.fingerprint
    assert Zeal(lower=0, upper=110, epsilon=1, grid_points=None).fingerprint == plain.fingerprint
    document = config_document("homes", PARAMS)
    assert document["grid_points"] == 12
    assert "grid_points" not in config_document("homes", plain)
    assert params_from_config(document) == PARAMS
    with pytest.raises(ParameterError, match="fingerprint"):
        params_from_config({**document, "grid_points": 13})
    for bad in (1, 1025, 2.5, True):
        with pytest.raises(ParameterError, match="grid_points"):
            Zeal(lower=0, upper=110, epsilon=1, grid_points=bad)
    with pytest.raises(ParameterError, match="grid sampler"), pytest.warns(ZealWarning):
        Zeal(lower=0, upper=110, epsilon=1, sampler="paper", grid_points=12)


def test_alpha_point_rounding_is_unbiased_over_the_offset() -> None:
    """Over 40,000 offsets, the grid value's mean is each reading, within 4 standard errors
    of the rounding (its variance f(1-f) step**2 at fractional position f)."""
    rng = np.random.default_rng(11)
    values, step = grid_values(PARAMS), 10.0
    readings = (0.0, 3.7, 37.3, 55.0, 109.99, 110.0, -4.0, 130.0)
    offsets = [draw_offset(rng) for _ in range(40_000)]
    table = np.array([values[grid_indices(PARAMS, readings, a)] for a in offsets])
    for x, rounded in zip(readings, table.T, strict=True):
        clipped = min(max(x, 0.0), 110.0)
        f = (clipped % step) / step
        sd = math.sqrt(f * (1 - f)) * step / math.sqrt(len(offsets))
        assert abs(rounded.mean() - clipped) <= 4 * sd + 1e-9, (x, rounded.mean())
    # For one offset the rounding is monotone and a constant reading keeps one value.
    index = grid_indices(PARAMS, np.linspace(-10, 120, 1001), 0.3)
    assert (np.diff(index) >= 0).all()
    assert len(set(grid_indices(PARAMS, [42.0] * 50, 0.3).tolist())) == 1


def test_a_memo_repeats_its_codes_books_draws_and_keeps_its_secret() -> None:
    rng = np.random.default_rng(3)
    memo = Memo.new(PARAMS, rng)
    first = memo.report(PARAMS, [21.0, 21.5, 22.0, 80.0, 21.0], rng=rng)
    again = memo.report(PARAMS, [80.0, 21.0], rng=rng)
    assert first.draws == len(set(grid_indices(PARAMS, [21, 21.5, 22, 80, 21], memo.offset)))
    assert again.draws == 0
    assert again.codes.tolist() == [first.codes[3], first.codes[0]]
    text = memo.to_json()
    assert Memo.from_json(text).codes == memo.codes
    assert Memo.from_json(text).offset == memo.offset
    assert repr(memo.offset) not in repr(memo)
    assert memo.offset.hex() not in repr(memo)
    with pytest.raises(ParameterError, match="another mechanism"):
        memo.report(Zeal(lower=0, upper=110, epsilon=1, grid_points=13), [1.0])
    with pytest.raises(ParameterError, match="does not read"):
        Memo.from_json('{"format": "zeal-memo/1"}')


@pytest.mark.parametrize(
    ("points", "bits", "times"), [(3, 3, 3), (2, 4, 4), (4, 3, 3)], ids=["3x3", "2x4", "4x3"]
)
def test_the_exact_audit_holds_and_is_tight(points: int, bits: int, times: int) -> None:
    """Every same-pattern pair of histories, every report sequence: the ratio stays within
    (w_hi / w_lo) ** draws within the horizon, exactly; some pair comes within 0.5 draws of
    the most values a history holds (so a bound one draw lower would fail); and every pair
    with another pattern is told apart (the timing of changes is not protected)."""
    params = Zeal(lower=0, upper=10, epsilon=1, payload_bits=bits, grid_points=points)
    found = audit_memo(params, times=times)
    print(found)
    assert found.holds
    assert found.holes == 0
    assert found.worst_loss_in_draws > min(points, times) - 0.5
    assert found.pattern_revealed == found.pattern_pairs > 0


def test_the_planner_gives_the_draws_a_fleet_makes() -> None:
    """Devices whose readings sweep a span of 45: the planner's expected draws (1 + span /
    step) against 2,000 simulated devices, within 4 standard errors; never more than its
    most."""
    plan = plan_grid(PARAMS, span=45.0, budget=8.0)
    assert plan.expected_loss <= 8.0 + 1e-9
    params = Zeal(lower=0, upper=110, epsilon=1, grid_points=plan.points)
    rng = np.random.default_rng(5)
    starts = rng.uniform(0, 110 - 45, size=(2000, 1))
    readings = starts + np.linspace(0, 45, 200)[None, :]
    _, draws = simulate_fleet(params, readings, rng=rng)
    sd = draws.std(ddof=1) / math.sqrt(draws.size)
    assert abs(draws.mean() - plan.expected_draws) <= 4 * sd
    assert draws.max() <= plan.most_draws


def fleet(rng: np.random.Generator, homes: int, hours: int) -> np.ndarray:
    """Homes of a city: its hours, each home shifted, wobbling, some missing hours."""
    temps = load_temps("seattle-temps.csv")
    start = int(rng.integers(0, temps.size - hours))
    x = temps[None, start : start + hours] + rng.normal(0, 4, (homes, 1))
    x = x + rng.normal(0, 1, x.shape) * rng.uniform(0.5, 2, (homes, 1))
    missing = rng.uniform(0, 0.6, (homes, 1)) * (rng.random((homes, 1)) < 0.5)
    return np.where(rng.random(x.shape) >= missing, x, np.nan)


def test_device_level_intervals_cover_and_reading_level_ones_do_not() -> None:
    """300 fleets of 150 homes over two days: the served interval (devices as the units)
    covers the window's mean at 0.95 within 3 binomial standard errors; the interval that
    treats the repeated codes as independent readings covers far less."""
    rng = np.random.default_rng(2026)
    fleets, covered, naive = 300, 0, 0
    for _ in range(fleets):
        x = fleet(rng, 150, 48)
        present = ~np.isnan(x)
        codes, _ = simulate_fleet(PARAMS, x, rng=rng)
        truth = float(np.nanmean(np.clip(x, 0, 110)))
        counts = present.sum(axis=1)
        sums = np.where(present, codes, 0).astype(np.int64).sum(axis=1)
        keep = counts > 0
        est = clustered_estimate(PARAMS, counts[keep].tolist(), sums[keep].tolist())
        covered += est.ci[0] <= truth <= est.ci[1]
        assert est.guaranteed[0] <= est.ci[0]
        assert est.ci[1] <= est.guaranteed[1]
        flat = PARAMS.estimate_mean(codes[present])
        naive += flat.ci[0] <= truth <= flat.ci[1]
    tolerance = 3 * math.sqrt(0.95 * 0.05 / fleets)
    print(f"coverage over {fleets} fleets: devices {covered / fleets}, readings {naive / fleets}")
    assert covered / fleets >= 0.95 - tolerance
    assert naive / fleets < 0.8
