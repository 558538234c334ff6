"""docs/privacy.md's sentence on what a year at the defaults gives away: its figure is
this simulation's (a constant reading privatized 8 times a day for a year, the mean
estimated from the codes alone)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zeal import Zeal


def test_a_years_codes_at_the_default_cap_give_the_mean_as_docs_privacy_says() -> None:
    params = Zeal(lower=0, upper=100, epsilon=1, max_epsilon_per_day=8.0)
    rng = np.random.default_rng(7)
    errors = [
        params.estimate_mean(params.perturb(np.full(8 * 365, 21.0), rng=rng)).mean - 21.0
        for _ in range(200)
    ]
    rmse = float(np.sqrt(np.mean(np.square(errors))))  # the range is 100 wide
    text = " ".join((Path(__file__).parents[2] / "docs" / "privacy.md").read_text().split())
    assert f"to {rmse:.2f} % of the range (root mean square error over 200 simulated years" in text
