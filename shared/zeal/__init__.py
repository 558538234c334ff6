"""Zeal: local differential privacy for sensor readings, compressed by design.

Public surface::

    Zeal(lower=..., upper=..., epsilon=...)   stream parameters, perturb, decode, estimate
    Estimate                                  an average with its intervals
    audit(params) -> AuditReport              the privacy loss the sampler really realizes
    ZealError, ParameterError, ReadingError, CodeError, ZealWarning
"""

from zeal.errors import CodeError, ParameterError, ReadingError, ZealError, ZealWarning
from zeal.estimate import Estimate
from zeal.grid import OutputDistribution
from zeal.mechanism import SAMPLERS, Zeal
from zeal.privacy_audit import AuditReport, audit

__all__ = [
    "SAMPLERS",
    "AuditReport",
    "CodeError",
    "Estimate",
    "OutputDistribution",
    "ParameterError",
    "ReadingError",
    "Zeal",
    "ZealError",
    "ZealWarning",
    "audit",
]
