"""The privacy audit: the grid sampler stays within budget; the paper's sampler does not."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from zeal import ParameterError, Zeal, ZealWarning, audit

RANGES = [(23.5, 83.9), (1.0, 120.0), (-0.001, 0.001)]
EPSILONS = [0.1, 0.5, 1.0, 2.0, 4.0, 8.0]


def accepted_widths(lower: float, upper: float, eps: float) -> list[int]:
    widths = []
    for k in range(2, 53):
        try:
            Zeal(lower=lower, upper=upper, epsilon=eps, payload_bits=k)
        except ParameterError as exc:
            if "supports at most" not in str(exc):
                raise
            continue
        widths.append(k)
    return widths


@pytest.mark.parametrize(("lower", "upper"), RANGES)
@pytest.mark.parametrize("eps", EPSILONS)
def test_grid_audit_within_budget_for_every_accepted_width(
    lower: float, upper: float, eps: float
) -> None:
    """Audited loss <= eps (1 + 1e-6) with no holes, for every width the constructor accepts."""
    widths = accepted_widths(lower, upper, eps)
    assert widths == list(range(2, widths[-1] + 1))
    assert widths[-1] >= 29
    for k in widths:
        report = audit(Zeal(lower=lower, upper=upper, epsilon=eps, payload_bits=k), max_outputs=512)
        assert report.holes == 0
        assert report.exact
        assert report.loss <= eps * (1 + 1e-6), (k, report)
        assert report.loss_bound is not None
        assert report.loss_bound <= eps
        assert report.within_budget()


def test_grid_audit_is_tight() -> None:
    """The realized loss is epsilon to within 1e-9 when the band is wider than a grid step."""
    report = Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=8).audit()
    assert report.loss == pytest.approx(1.0, abs=1e-9)


def test_paper_sampler_fails_the_audit_at_its_own_minimum_exponent() -> None:
    """At Eu = e_vul the paper's float sampler leaks: a hole or a loss of at least 1.3."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZealWarning)
        z = Zeal(lower=23.5, upper=83.9, epsilon=1, exponent=8, sampler="paper")
    assert z.exponent == z.e_vul == 8
    report = z.audit()
    assert report.holes > 0 or report.finite_loss >= 1.3
    assert not report.within_budget()


def test_cli_audit_reports_and_sets_the_exit_code() -> None:
    """`python -m zeal audit` prints the report; exit 0 within budget, 1 over it, 2 on bad input."""
    base = [
        sys.executable,
        "-m",
        "zeal",
        "audit",
        "--lower",
        "23.5",
        "--upper",
        "83.9",
        "--epsilon",
        "1",
    ]
    ok = subprocess.run([*base, "--payload-bits", "6"], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "within budget     True" in ok.stdout
    leaky = subprocess.run(
        [*base, "--exponent", "8", "--sampler", "paper"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert leaky.returncode == 1
    assert "within budget     False" in leaky.stdout
    bad = subprocess.run(
        [*base, "--payload-bits", "99"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2
    assert "payload_bits=99 is outside [2, 52]" in bad.stderr
