"""Zeal: local differential privacy for sensor readings, compressed by design.

Public surface::

    Zeal(lower=..., upper=..., epsilon=...)   stream parameters, perturb, decode, estimate
    Estimate                                  an average with its intervals
    audit(params) -> AuditReport              the privacy loss the sampler really realizes
    encode_batch / decode_batch -> Batch      wire format v2 (docs/wire-format.md)
    exact_sum / exact_sum_squares             exact integer sums of codes (the store's sums)
    ZealError, ParameterError, ReadingError, CodeError, WireError, ZealWarning

Public modules, which the edge, the server, benchmarks and tools may import (PUBLIC_MODULES;
tests/test_architecture.py holds it to the files)::

    errors       the exception tree
    protocol     names, parameter limits, the reject reasons
    policy       a stream's privacy policy in integer micro-epsilon
    wire         the batch format; wirebatches: many payloads of a stream decoded at once
    lorawan      the LoRaWAN profile of the batch format: what the network carries is not sent
    topics       the MQTT topic layout
    streamconfig, brokerurl, mqttclient    configuration documents, broker URLs, paho clients
    signed       what a server signs: the bytes a signature covers
    estimate     an average's estimate and intervals
    compare, plan, windowplan, bayes, censored   comparisons, planners, small-window estimates
    baselines    the other papers' mechanisms, for benchmarks
    vocabulary   renamed options and variables: the old name still works, with a warning

Every other module has a leading underscore: the mechanism and its samplers, the code width,
randomness, the exact sums, the privacy audit, the firmware profiles, the benchmarks.
"""

from zeal._distribution import OutputDistribution
from zeal._exact import exact_sum, exact_sum_squares
from zeal._mechanism import SAMPLERS, Zeal
from zeal._privacy_audit import AuditReport, audit
from zeal.errors import CodeError, ParameterError, ReadingError, ZealError, ZealWarning
from zeal.estimate import Estimate
from zeal.wire import REASONS, Batch, CodecParams, WireError, decode_batch, encode_batch

#: The submodules other packages may import; the rest are private (a leading underscore).
PUBLIC_MODULES = (
    "baselines",
    "bayes",
    "brokerurl",
    "censored",
    "compare",
    "errors",
    "estimate",
    "lorawan",
    "mqttclient",
    "plan",
    "policy",
    "protocol",
    "signed",
    "streamconfig",
    "topics",
    "vocabulary",
    "windowplan",
    "wire",
    "wirebatches",
)

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
