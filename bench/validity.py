"""The validity matrix of the /compare methods (python bench/validity.py [--reps 2000]):
every method on every fleet of tools/validity.py (10 and 30 devices per group, epsilon 1
and 4, equal and unequal readings per device, lognormal and normal device means, and one
faulty device), seeded. Writes bench/VALIDITY.md and bench/validity.json.

Per method and fleet: the rejection rate at 0.05 with no shift (the type-I error; in a
faulty fleet the genuine devices do not differ, but the method's estimand may, so the rate
is a robustness figure, not a type-I error), the coverage of the stated estimand by the 95 %
interval with no shift and with the shift, and the power at the shift; each with its Monte
Carlo standard error.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tools.validity import METHODS, Fleet, Tally, fleets, run

HERE = Path(__file__).resolve().parent


LEVEL_BOUNDS = (0.025, 0.085)
LEAST_COVERAGE = 0.93


def figures(tally: Tally) -> dict[str, tuple[float, float]]:
    reps = tally.reps
    return {
        "type_i": Tally.rate(tally.rejected_null, reps),
        "coverage_null": Tally.rate(tally.covered_null, reps),
        "coverage_shift": Tally.rate(tally.covered_shift, reps),
        "power": Tally.rate(tally.rejected_shift, reps),
        "refused": Tally.rate(tally.refused, reps),
    }


def cell(rate: tuple[float, float]) -> str:
    return f"{rate[0]:.3f} ± {rate[1]:.3f}"


def fails(fleet: Fleet, found: dict[str, tuple[float, float]]) -> list[str]:
    """The acceptance bounds a method misses on a fleet (type-I on fleets without a fault)."""
    out: list[str] = []
    if found["refused"][0] == 1.0:
        return out  # not offered on this fleet
    if found["refused"][0] > 0:
        out.append("refused in some repetitions")
    low, high = LEVEL_BOUNDS
    if not fleet.faulty and not low <= found["type_i"][0] <= high:
        out.append("type-I")
    if min(found["coverage_null"][0], found["coverage_shift"][0]) < LEAST_COVERAGE:
        out.append("coverage")
    return out


def markdown(rows: list[dict[str, object]], reps: int, seconds: float) -> str:
    lines = [
        "# Validity of the /compare methods on simulated fleets",
        "",
        f"Written by `python bench/validity.py --reps {reps}` in {seconds / 60:.0f} minutes "
        "(seeded: a rerun gives the same figures). The fleets (tools/validity.py): two groups "
        "of devices whose levels differ (lognormal, skewed, or normal), 40 % zero readings, "
        "the rest gamma around the device's level, clipped to 0..100, 48 readings per device "
        "(equal, or uniform from 12 to 84), every reading privatized with `Zeal.perturb` "
        "and decoded. The shift adds 8 (lognormal) or 6 (normal) to group A's device levels. "
        "Each method is judged against its own estimand (the answer's `estimand` field), "
        "computed from 20,000 simulated devices per group. Figures are rates ± one Monte "
        f"Carlo standard error over {reps:,} repetitions per fleet. Acceptance: type-I in "
        f"[{LEVEL_BOUNDS[0]}, {LEVEL_BOUNDS[1]}] and coverage at least {LEAST_COVERAGE}; "
        "**bold** marks a miss. In a faulty fleet (one device of group A reports the top of "
        "the range) the *rejects* column is the rejection rate when the genuine devices do "
        "not differ: a robustness figure, not a type-I error, since the fault moves every "
        "estimand (the estimand column gives by how much, against the shift).",
        "",
        "| fleet | method | rejects with no shift | coverage, no shift | coverage, shift "
        "| power at the shift | estimand: no shift; shift |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        found = row["figures"]
        assert isinstance(found, dict)
        missed = row["fails"]
        assert isinstance(missed, list)
        level = cell(found["type_i"])
        covers = [cell(found["coverage_null"]), cell(found["coverage_shift"])]
        if "type-I" in missed:
            level = f"**{level}**"
        if "coverage" in missed:
            covers = [f"**{c}**" for c in covers]
        truth = row["estimand"]
        assert isinstance(truth, list)
        if found["refused"][0] == 1.0:
            lines.append(
                f"| {row['fleet']} | {row['method']} | not offered (too few devices) | | | | |"
            )
            continue
        lines.append(
            f"| {row['fleet']} | {row['method']} | {level} | {covers[0]} | {covers[1]} | "
            f"{cell(found['power'])} | {truth[0]:.2f}; {truth[1]:.2f} |"
        )
    misses = [r for r in rows if r["fails"]]
    lines += ["", f"Cells that miss an acceptance bound: {len(misses)} of {len(rows)}."]
    for r in misses:
        lines.append(f"- {r['fleet']}, {r['method']}: {', '.join(r['fails'])}")  # type: ignore[arg-type]
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=HERE / "VALIDITY.md")
    parser.add_argument("--json", type=Path, default=HERE / "validity.json")
    args = parser.parse_args()
    began = time.time()
    rows: list[dict[str, object]] = []
    for i, fleet in enumerate(fleets()):
        tallies, truths = run(fleet, args.reps, seed=1000 + 10 * i)
        for method in METHODS:
            found = figures(tallies[method])
            rows.append(
                {
                    "fleet": fleet.name,
                    "method": method,
                    "reps": args.reps,
                    "figures": found,
                    "estimand": list(truths[method]),
                    "fails": fails(fleet, found),
                }
            )
        print(f"{fleet.name}: done ({time.time() - began:.0f} s)", flush=True)
    args.json.write_text(json.dumps(rows, indent=1) + "\n")
    text = markdown(rows, args.reps, time.time() - began)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
