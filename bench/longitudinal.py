"""Longitudinal streams against plain ones over a year of a fleet's hourly readings: each
home's privacy loss by the documented accounting (zeal.longitudinal: a draw per grid value
met), the fleet's hourly average, each home's yearly mean as the operator can estimate it
from all its codes, and the coverage of the served interval of a window's average.

The fleet: the bundled hourly temperatures of Seattle in 2010 (data/seattle-temps.csv,
8,759 hours), each home with an offset of its own (normal, sd 4 degF), a wobble of its own
size (sd 0.5 to 2 degF, independent each hour) and, for the coverage fleets, a share of
homes that miss hours (each home its own rate, up to 60 % missing). Stream: 0..110 degF,
epsilon 1 per code, the grid the planner gives for a budget of 8 epsilon over a span of
45 degF. Writes bench/longitudinal.json.

    python bench/longitudinal.py [--homes 1000] [--fleets 200] [--seed 7]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
from pathlib import Path

import numpy as np

from zeal import Zeal
from zeal.longitudinal import (
    audit_memo,
    clustered_estimate,
    loss,
    plan_grid,
    simulate_fleet,
)

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data" / "seattle-temps.csv"
LOWER, UPPER, EPSILON = 0.0, 110.0, 1.0
#: What the grid is planned for: a home's loss over a year, for the span of its readings.
BUDGET = 8.0
#: The span the grid is planned for: the city's year spans 38.4 degF, a home's a few more
#: (its own wobble).
SPAN = 45.0
WINDOW_HOURS = 168


def temperatures() -> np.ndarray:
    with DATA.open(newline="") as handle:
        return np.array([float(row["temp"]) for row in csv.DictReader(handle)])


def fleet(base: np.ndarray, homes: int, rng: np.random.Generator) -> np.ndarray:
    """Homes x hours of readings: the city's hours, each home shifted and wobbling."""
    offsets = rng.normal(0.0, 4.0, size=(homes, 1))
    wobble = rng.uniform(0.5, 2.0, size=(homes, 1))
    return base[None, :] + offsets + rng.normal(0.0, 1.0, size=(homes, base.size)) * wobble


def codes_sums(codes: np.ndarray, present: np.ndarray) -> tuple[list, list]:
    counts = present.sum(axis=1)
    sums = np.where(present, codes, 0).astype(np.int64).sum(axis=1)
    keep = counts > 0
    return counts[keep].tolist(), sums[keep].tolist()


def year(params: Zeal, plain: Zeal, homes: int, rng: np.random.Generator) -> dict:
    base = temperatures()
    readings = fleet(base, homes, rng)
    hours = base.size
    started = time.perf_counter()
    codes, draws = simulate_fleet(params, readings, rng=rng)
    plain_codes = plain.perturb(readings, rng=rng)
    simulated = time.perf_counter() - started
    losses = np.array([loss(params, int(d)) for d in draws])
    span = readings.max(axis=1) - readings.min(axis=1)
    # The fleet's hourly average: one code per home and hour, standard errors as served.
    se_long, se_plain, err_long, err_plain = [], [], [], []
    present = np.ones((homes, 1), dtype=bool)
    for t in range(hours):
        truth = float(readings[:, t].mean())
        counts, sums = codes_sums(codes[:, t : t + 1], present)
        a = clustered_estimate(params, counts, sums)
        b = plain.estimate_mean(plain_codes[:, t])
        se_long.append(a.std_error)
        se_plain.append(b.std_error)
        err_long.append(a.mean - truth)
        err_plain.append(b.mean - truth)
    # Each home's yearly mean, as the operator estimates it from all its codes.
    width = UPPER - LOWER
    truth_year = readings.clip(LOWER, UPPER).mean(axis=1)
    long_year = params.decode(codes).mean(axis=1)
    plain_year = plain.decode(plain_codes).mean(axis=1)
    rmse_long = float(np.sqrt(np.mean((long_year - truth_year) ** 2))) / width
    rmse_plain = float(np.sqrt(np.mean((plain_year - truth_year) ** 2))) / width
    return {
        "homes": homes,
        "hours": hours,
        "simulated_seconds": round(simulated, 2),
        "loss_median": float(np.median(losses)),
        "loss_p90": float(np.quantile(losses, 0.9)),
        "loss_max": float(losses.max()),
        "plain_loss": hours * (plain.realized_epsilon or EPSILON),
        "span_median": float(np.median(span)),
        "hourly_se_long_median": float(np.median(se_long)),
        "hourly_se_plain_median": float(np.median(se_plain)),
        "hourly_se_ratio": float(np.median(se_long) / np.median(se_plain)),
        "hourly_rmse_long": float(np.sqrt(np.mean(np.square(err_long)))),
        "hourly_rmse_plain": float(np.sqrt(np.mean(np.square(err_plain)))),
        "yearly_rmse_long_share": rmse_long,
        "yearly_rmse_plain_share": rmse_plain,
        "yearly_rmse_ratio": rmse_long / rmse_plain,
    }


def coverage(params: Zeal, homes: int, fleets: int, rng: np.random.Generator) -> dict:
    """The served 95 % interval of a week's average, over `fleets` simulated fleets (each
    at its own week of the year, its homes each missing hours at a rate of their own)."""
    base = temperatures()
    covered, guaranteed, z = 0, 0, []
    for _ in range(fleets):
        start = int(rng.integers(0, base.size - WINDOW_HOURS))
        readings = fleet(base[start : start + WINDOW_HOURS], homes, rng)
        missing = rng.uniform(0.0, 0.6, size=(homes, 1)) * (rng.random((homes, 1)) < 0.5)
        present = rng.random(readings.shape) >= missing
        readings = np.where(present, readings, np.nan)
        codes, _ = simulate_fleet(params, readings, rng=rng)
        truth = float(np.nanmean(np.clip(readings, LOWER, UPPER)))
        counts, sums = codes_sums(codes, present)
        est = clustered_estimate(params, counts, sums)
        covered += est.ci[0] <= truth <= est.ci[1]
        guaranteed += est.guaranteed[0] <= truth <= est.guaranteed[1]
        z.append((est.mean - truth) / est.std_error)
    return {
        "fleets": fleets,
        "homes": homes,
        "window_hours": WINDOW_HOURS,
        "coverage": covered / fleets,
        "coverage_se": math.sqrt(0.95 * 0.05 / fleets),
        "guaranteed_coverage": guaranteed / fleets,
        "z_mean": float(np.mean(z)),
        "z_sd": float(np.std(z, ddof=1)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--homes", type=int, default=1000)
    parser.add_argument("--fleets", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=HERE / "longitudinal.json")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    stream = Zeal(lower=LOWER, upper=UPPER, epsilon=EPSILON)
    plan = plan_grid(stream, span=SPAN, budget=BUDGET)
    params = Zeal(lower=LOWER, upper=UPPER, epsilon=EPSILON, grid_points=plan.points)
    print(
        f"grid: {plan.points} values {plan.step:.2f} degF apart (planner, budget {BUDGET:g} "
        f"over a span of {plan.span:.1f}): expected {plan.expected_loss:.2f} epsilon, at most "
        f"{plan.most_draws} draws, {plan.lifetime:.2f} over a lifetime"
    )
    small = Zeal(lower=LOWER, upper=UPPER, epsilon=EPSILON, payload_bits=3, grid_points=3)
    audited = audit_memo(small, times=3)
    print(f"audit (3 values, 3-bit codes): {audited}")
    result = year(params, stream, args.homes, rng)
    r = result
    print(
        f"{r['homes']:,} homes x {r['hours']:,} hours, epsilon {EPSILON:g} per code: "
        f"loss over the year median {r['loss_median']:.2f}, 90th percentile "
        f"{r['loss_p90']:.2f}, max {r['loss_max']:.2f} (plain: {r['plain_loss']:,.0f}); "
        f"median span of a home's readings {r['span_median']:.1f} degF"
    )
    print(
        f"hourly average over the fleet: standard error median {r['hourly_se_long_median']:.3f} "
        f"longitudinal, {r['hourly_se_plain_median']:.3f} plain, ratio "
        f"{r['hourly_se_ratio']:.3f}; RMSE over the hours {r['hourly_rmse_long']:.3f} and "
        f"{r['hourly_rmse_plain']:.3f}"
    )
    print(
        f"a home's yearly mean from all its codes: RMSE {r['yearly_rmse_long_share']:.2%} of "
        f"the range longitudinal, {r['yearly_rmse_plain_share']:.2%} plain: "
        f"{r['yearly_rmse_ratio']:.1f}x"
    )
    covered = coverage(params, args.homes, args.fleets, rng)
    c = covered
    print(
        f"coverage of the served 95 % interval of a {c['window_hours']}-hour average over "
        f"{c['fleets']} fleets of {c['homes']:,} homes: {c['coverage']:.3f} (+- "
        f"{c['coverage_se']:.3f}); guaranteed interval {c['guaranteed_coverage']:.3f}; "
        f"z mean {c['z_mean']:+.3f}, sd {c['z_sd']:.3f}"
    )
    out = {
        "seed": args.seed,
        "grid_points": plan.points,
        "planned_expected_loss": plan.expected_loss,
        "audit": {"holds": audited.holds, "pairs": audited.pairs},
        "year": result,
        "coverage": covered,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
