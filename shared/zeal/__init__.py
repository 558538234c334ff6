"""Zeal: local differential privacy for sensor readings, compressed by design.

Public surface::

    Zeal(lower=..., upper=..., epsilon=...)   stream parameters, perturb, decode, estimate
    Estimate                                  an average with its intervals
    audit(params) -> AuditReport              the privacy loss the sampler really realizes
    encode_batch / decode_batch -> Batch      wire format v2 (docs/wire-format.md)
    exact_sum / exact_sum_squares             exact integer sums of codes (the store's sums)
    ZealError, ParameterError, ReadingError, CodeError, WireError, ZealWarning
"""

from zeal._exact import exact_sum, exact_sum_squares
from zeal.distribution import OutputDistribution
from zeal.errors import CodeError, ParameterError, ReadingError, ZealError, ZealWarning
from zeal.estimate import Estimate
from zeal.mechanism import SAMPLERS, Zeal
from zeal.privacy_audit import AuditReport, audit
from zeal.wire import REASONS, Batch, CodecParams, WireError, decode_batch, encode_batch

__all__ = [
    "REASONS",
    "SAMPLERS",
    "AuditReport",
    "Batch",
    "CodeError",
    "CodecParams",
    "Estimate",
    "OutputDistribution",
    "ParameterError",
    "ReadingError",
    "WireError",
    "Zeal",
    "ZealError",
    "ZealWarning",
    "audit",
    "decode_batch",
    "encode_batch",
    "exact_sum",
    "exact_sum_squares",
]
