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
    longitudinal memoized streams: alpha-point rounding, the memo table, its accounting,
                 device-level estimates, the grid planner and the exact memo audit
    lorawan      the LoRaWAN profile of the batch format: what the network carries is not sent
    mqtt         the MQTT transport: mqtt.topics (the topic layout), mqtt.streamconfig
                 (configuration documents), mqtt.brokerurl (broker URLs), mqtt.client (the
                 paho clients: the one module that imports paho, the ``mqtt`` extra)
    signed       what a server signs: the bytes a signature covers
    estimate     an average's estimate and intervals
    distribution the readings' distribution (histogram, quantiles) estimated from codes
    compare, bayes, censored   group comparisons, small-window estimates
    planning     planners: planning.comparison (a group comparison's power before the data
                 exist), planning.windows (a fleet's window averages under a policy)
    baselines    the other papers' mechanisms, for benchmarks
    vocabulary   renamed options and variables: the old name still works, with a warning

Everything else is in the private package ``zeal._core``: the mechanism and its samplers,
the code width, randomness, the exact sums, the privacy audit, the firmware profiles.
"""

from zeal._core.distribution import OutputDistribution
from zeal._core.exact import exact_sum, exact_sum_squares
from zeal._core.mechanism import SAMPLERS, Zeal
from zeal._core.privacy_audit import AuditReport, audit
from zeal.errors import CodeError, ParameterError, ReadingError, ZealError, ZealWarning
from zeal.estimate import Estimate
from zeal.wire import REASONS, Batch, CodecParams, WireError, decode_batch, encode_batch

#: The submodules and subpackages other packages may import; ``_core`` is private.
PUBLIC_MODULES = (
    "baselines",
    "bayes",
    "censored",
    "compare",
    "distribution",
    "errors",
    "estimate",
    "longitudinal",
    "lorawan",
    "mqtt",
    "planning",
    "policy",
    "protocol",
    "signed",
    "vocabulary",
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
