"""Request and response models of the HTTP API (pydantic, the HTTP edge only)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from zeal.policy import DEFAULT_MAX_EPSILON_PER_DAY, MAX_EPSILON_PER_DAY
from zeal.protocol import BUCKET_SECONDS, EPSILON_CEILING, EXPONENT, GRID_POINTS, PAYLOAD_BITS
from zeal_server import store

__all__ = [
    "HEAVY",
    "AverageOut",
    "BindingIn",
    "BindingOut",
    "CompareOut",
    "DeletedOut",
    "DeviceOut",
    "DevicesOut",
    "DistributionOut",
    "EfficiencyOut",
    "EstimateOut",
    "GroupOut",
    "PointOut",
    "Problem",
    "QuantileOut",
    "RejectsOut",
    "SenderOut",
    "SeriesOut",
    "ServerOut",
    "ShareOut",
    "StatsOut",
    "StatusOut",
    "StreamIn",
    "StreamOut",
    "StreamPatch",
    "TagsIn",
    "ValueOut",
]


class Strict(BaseModel):
    """A request body: a name it does not define is refused (422, naming it), never
    ignored."""

    model_config = ConfigDict(extra="forbid")


class StreamIn(Strict):
    name: str = Field(description="stream name: 1-64 letters, digits, '_', '.' or '-'")
    lower: float = Field(description="lower end of the feasible range")
    upper: float = Field(description="upper end of the feasible range")
    epsilon: float = Field(
        description="privacy budget per reading, at most zeal.protocol.EPSILON_CEILING (the "
        "agents' default ceiling)",
        gt=0,
        le=EPSILON_CEILING,
    )
    payload_bits: int | None = Field(
        None,
        ge=PAYLOAD_BITS[0],
        le=store.MAX_SERVER_BITS,
        description="code width (default: chosen by the library)",
    )
    exponent: int | None = Field(
        None, ge=EXPONENT[0], le=EXPONENT[1], description="binade exponent E_U*"
    )
    bucket_seconds: int = Field(
        60, ge=BUCKET_SECONDS[0], le=BUCKET_SECONDS[1], description="time aggregation bucket"
    )
    description: str = Field("", max_length=500)
    unit: str = Field(
        "", max_length=32, description="what the readings measure in, e.g. degF, kWh, mg/dL"
    )
    enrolled_only: bool = Field(
        False,
        description="accept data only from devices enrolled beforehand with "
        "PUT /streams/{name}/devices/{device} (the broker lets any device publish to any "
        "stream under its own name)",
    )
    retention_days: int | None = Field(
        None,
        ge=1,
        le=36_500,
        description="delete whole buckets older than this many days (default: keep all)",
    )
    max_epsilon_per_day: float = Field(
        DEFAULT_MAX_EPSILON_PER_DAY,
        gt=0,
        le=MAX_EPSILON_PER_DAY,
        description="privacy policy: the privacy loss one device may spend per UTC day of its "
        "readings' timestamps (each reading costs epsilon; the agent and the collector both "
        "enforce it, the collector refusing excess batches as over_budget). The default, 8, "
        "allows 8 readings a day at epsilon 1: raise it knowingly (docs/privacy.md)",
    )
    grid_points: int | None = Field(
        None,
        ge=GRID_POINTS[0],
        le=GRID_POINTS[1],
        description="make the stream longitudinal: each device rounds a reading to one of "
        "this many evenly spaced values of the range (with a secret offset of its own) and "
        "sends the code it drew the first time it met that value, so a device's loss is "
        "bounded by the values it visits, not by how often it reports; what the timing of "
        "changes reveals is not (docs/privacy.md, 'Longitudinal streams'; "
        "GET /preview/grid helps choose). Default: a plain stream",
    )


class StreamPatch(Strict):
    """What may change on an existing stream: its retention, and its privacy policy (a new
    policy gives the stream a new fingerprint: devices are refused until they take the new
    configuration). Its mechanism never changes. Fields left out stay as they are."""

    retention_days: int | None = Field(
        None,
        description="delete whole buckets older than this many days; null keeps everything",
        ge=1,
        le=36_500,
    )
    max_epsilon_per_day: float | None = Field(
        None, gt=0, le=MAX_EPSILON_PER_DAY, description="the new privacy policy (see StreamIn)"
    )

    @model_validator(mode="before")
    @classmethod
    def _only_what_may_change(cls, data: Any) -> Any:
        if isinstance(data, dict):
            fixed = sorted(set(data) - set(cls.model_fields))
            if fixed:
                raise ValueError(
                    f"{', '.join(fixed)} cannot change on an existing stream (its mechanism "
                    "is fixed: create a new stream); what may change: "
                    + ", ".join(cls.model_fields)
                )
        return data


class StreamOut(BaseModel):
    name: str
    lower: float
    upper: float
    epsilon: float
    realized_epsilon: float | None
    exponent: int
    payload_bits: int
    shared_bits: int
    sampler: str
    fingerprint: str
    bucket_seconds: int
    C: float
    abar: float
    grid_step: float
    description: str
    unit: str
    enrolled_only: bool
    retention_days: int | None
    max_epsilon_per_day: float | None = Field(
        description="privacy policy: loss one device may spend per UTC day (null: none, a "
        "stream made before policies)"
    )
    readings_per_day: int | None = Field(
        description="readings one device may send per UTC day under the policy"
    )
    readings_per_hour: int | None = Field(
        description="readings one device may send per UTC hour: twice the day's even rate"
    )
    grid_points: int | None = Field(
        None,
        description="a longitudinal stream's grid values (null: a plain stream); its "
        "readings cost epsilon only as new grid values are drawn",
    )
    created: datetime
    released: datetime | None = Field(
        None,
        description="when the operator last released the agents halted on this stream "
        "(POST .../release; null: never): its signed configuration says so, and agents "
        "that halted with --on-halt wait adopt it",
    )


class BindingIn(Strict):
    """Where a ChirpStack application's uplinks on one FPort go (docs/lorawan.md)."""

    stream: str = Field(description="the stream their readings are stored in")
    device_names: Literal["dev_eui", "device_name"] = Field(
        "dev_eui",
        description="a device's Zeal name: its DevEUI (16 lower-case hex digits) or its "
        "ChirpStack device name (which must be a valid Zeal device name)",
    )


class BindingOut(BaseModel):
    application_id: str = Field(description="ChirpStack's application id")
    f_port: int = Field(description="the FPort, 1 to 223; 0: the application's other ports")
    stream: str
    device_names: Literal["dev_eui", "device_name"]
    created: datetime


class DeletedOut(BaseModel):
    stream: str
    device: str | None = Field(None, description="the device whose data was deleted")
    readings: int = Field(description="readings that were stored and are now gone")


class EstimateOut(BaseModel):
    mean: float = Field(
        description="AVG*, unbiased and never clamped: at small n it can lie outside the "
        "range, and outside its own intervals"
    )
    std_error: float
    ci: tuple[float, float] = Field(
        description="normal-approximation interval at the confidence asked, cut to the "
        "stream's range (each end moved into [lower, upper]: the average lies there, so "
        "the coverage is unchanged)"
    )
    guaranteed: tuple[float, float] = Field(
        description="guaranteed (Bernstein, Theorem 3) interval, valid at any n, cut to the "
        "stream's range as ci is"
    )
    in_range: bool = Field(description="whether mean lies in [lower, upper]")


class BayesOut(BaseModel):
    """A Bayes estimate beside AVG* (estimator=bayes; docs/bayes.md): never summed into
    other figures."""

    model: str = Field(description="mean, binary or constant")
    assumes: str = Field(description="what the model assumes of the readings")
    prior: str = Field(description="the prior used")
    mean: float = Field(description="posterior mean: the estimate under squared loss")
    median: float = Field(description="posterior median: the estimate under absolute loss")
    interval: tuple[float, float] = Field(description="equal-tailed credible interval")
    level: float = Field(description="its level (the query's confidence)")
    n: int = Field(description="readings behind it")


class AverageOut(BaseModel):
    stream: str
    start: datetime | None = Field(description="start of the first bucket used")
    end: datetime | None = Field(description="end of the last bucket used")
    group: str | None
    n: int
    confidence: float
    estimate: EstimateOut | None = Field(description="null when the window holds no readings")
    epsilon: float
    payload_bits: int
    device: str | None = None
    bayes: BayesOut | None = Field(
        default=None, description="with estimator=bayes: the posterior summary beside AVG*"
    )
    excluded: list[str] = Field(
        default=[], description="with exclude=implausible: the devices left out, by name"
    )


class QuantileOut(BaseModel):
    q: float = Field(description="the level asked for")
    value: float = Field(
        description="the estimated quantile: the least reading with at "
        "least this share of the readings at or below it"
    )
    low: float | None = Field(description="its interval's lower end (null: see intervals)")
    high: float | None = Field(description="its interval's upper end")


class ShareOut(BaseModel):
    threshold: float
    share: float = Field(description="the estimated share of readings above the threshold")
    low: float | None = Field(description="its interval's lower end (null: see intervals)")
    high: float | None = Field(description="its interval's upper end")


class ValueOut(BaseModel):
    value: float
    low: float | None = Field(description="its interval's lower end (null: see intervals)")
    high: float | None = Field(description="its interval's upper end")


class DistributionOut(BaseModel):
    stream: str
    start: datetime | None = Field(description="start of the first bucket used")
    end: datetime | None = Field(description="end of the last bucket used")
    group: str | None
    device: str | None = None
    n: int = Field(description="readings in the window")
    devices: int = Field(description="devices with readings in the window")
    confidence: float = Field(description="the intervals' nominal level")
    edges: list[float] = Field(description="the histogram's bins + 1 edges, lower to upper")
    probabilities: list[float] = Field(
        description="each bin's share of the readings (sums to 1; readings at a bound count "
        "in the first or the last bin)"
    )
    quantiles: list[QuantileOut]
    above: ShareOut | None = Field(description="with above=: the share above the threshold")
    mean: ValueOut = Field(
        description="the distribution's mean (AVG* at /average is the unbiased estimate; "
        "this one agrees with it within its interval)"
    )
    intervals: str | None = Field(
        description="null when the intervals are given; else why they are not"
    )
    method: str
    estimand: str


class PointOut(BaseModel):
    start: datetime
    end: datetime
    n: int
    estimate: EstimateOut | None
    bayes: BayesOut | None = Field(
        default=None, description="with estimator=bayes: the point's posterior summary"
    )
    quantile: QuantileOut | None = Field(
        default=None,
        description="with quantile=Q: the point's quantile, its interval at 0.95 (null ends: "
        "fewer devices than an interval needs, docs/distribution.md)",
    )


class SeriesOut(BaseModel):
    stream: str
    interval_seconds: int
    group: str | None
    device: str | None = None
    confidence: float
    points: list[PointOut]
    excluded: list[str] = Field(
        default=[],
        description="with exclude=implausible: the devices left out of every point (flagged "
        "over the whole window), by name",
    )


class CompareOut(BaseModel):
    """Group A minus group B. ``mean_a``/``mean_b`` are the groups' reading-weighted
    averages (AVG*); the inference follows ``independent`` and ``method``. ``a``, ``b`` and
    ``unit`` repeat ``group_a``, ``group_b`` and ``independent`` under their old names, for
    one release."""

    stream: str
    group_a: str
    group_b: str
    a: str = Field(deprecated=True, description="group_a, under its old name")
    b: str = Field(deprecated=True, description="group_b, under its old name")
    n_a: int
    n_b: int
    mean_a: float | None
    mean_b: float | None
    independent: str = Field(description="the independent units: device (the default) or reading")
    unit: str = Field(deprecated=True, description="independent, under its old name")
    method: str = Field(
        description="cluster, device_means, trimmed, winsorized, censored, or reading"
    )
    estimand: str = Field(
        default="",
        description="what difference estimates, in words; for trimmed, winsorized and "
        "censored it says that it is not the difference of means unless device means are "
        "symmetric",
    )
    difference: float | None = None
    std_error: float | None = None
    df: float | None = Field(
        default=None,
        description="degrees of freedom of the t reference (none: normal, unit=reading)",
    )
    ci: tuple[float, float] | None = Field(
        default=None,
        description="interval of the difference, cut to what a difference of two values "
        "in the stream's range can be (plus or minus its width)",
    )
    p_value: float | None = Field(default=None, description="two-sided test of equal means")
    confidence: float
    partitions: tuple[int, int] | None = Field(
        default=None, description="independent units per group: devices"
    )
    smallest: tuple[int, int] | None = Field(
        default=None, description="readings in each group's smallest partition"
    )
    median: tuple[float, float] | None = Field(
        default=None, description="readings in each group's median partition"
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="few partitions, shared devices, or why there is no inference",
    )


class DeviceOut(BaseModel):
    name: str
    tags: dict[str, str]
    first_seen: datetime
    last_seen: datetime
    readings: int
    batches: int
    epsilon_spent: float = Field(
        description="privacy loss spent since first seen: readings stored times epsilon "
        "(counted in integer micro-epsilon, each reading rounded up); on a longitudinal "
        "stream, the distinct codes it sent times epsilon (a memoized repeat costs nothing)"
    )
    epsilon_today: float = Field(
        description="privacy loss spent on readings stamped in the current UTC day, the "
        "period of the stream's policy (max_epsilon_per_day)"
    )
    flags: list[str] = Field(
        default=[],
        description="implausible: its readings prove it dishonest (its guaranteed interval at "
        "level 1 - 1e-9 lies wholly outside the range; exclude=implausible leaves it out of "
        "averages); over_budget: batches of it were refused at the policy; device_cap: batches "
        "of it were refused at its daily cap across all its streams (/api/v1/budgets); "
        "at_cap: today's readings, or those of one of today's UTC hours, reached what the "
        "policy allows",
    )
    duplicates: int = Field(description="batches received again and dropped (a lost PUBACK)")
    sequence_resets: int = Field(
        description="batches stored although their sequence number had been used before "
        "for other content: the device's outbox was reset, or two agents share its id"
    )
    missing: int = Field(
        description="sequence numbers it never delivered, counted once they can no longer "
        "arrive (the import window has passed them, or they lie 256 sequences below its "
        "highest); LoRaWAN: frame counters, which also count frames of other ports and "
        "MAC-only frames (docs/lorawan.md)"
    )
    late: int = Field(description="batches stored after a higher sequence of it (out of order)")
    rejects: dict[str, int] = Field(
        default={},
        description="its messages refused, by reason (docs/server.md): what a device that "
        "no notice reaches (a LoRaWAN one) is told nowhere else",
    )
    account: dict[str, float] = Field(
        default={},
        description="epsilon the device spent over all its streams with a policy (its own "
        "ledger, as /api/v1/budgets/devices/{device} gives it): last_7_days, last_30_days, "
        "last_365_days (UTC days, today included) and since_first_seen",
    )


class DevicesOut(BaseModel):
    total: int
    limit: int
    offset: int
    devices: list[DeviceOut]


class GroupOut(BaseModel):
    group: str = Field(description="key:value, usable as the group parameter")
    devices: int


class TagsIn(Strict):
    tags: dict[str, str] = Field(description='replaces the device\'s tags, e.g. {"site": "aarhus"}')


class EfficiencyOut(BaseModel):
    """Bits per reading, measured on the stream's data (see zeal_server.store.efficiency); the
    store figures are those of the compacted rows, or of the raw parts while none is."""

    sample: int = Field(description="recent stored readings the alternatives were measured on")
    wire_bits: float = Field(description="Zeal payload bits per reading received")
    json_bits: float = Field(description='a JSON message {"ts", "value"} per reading')
    float64_bits: float = Field(description="a raw float64 value (timestamp not counted)")
    wire_vs_json: float
    wire_vs_float64: float
    store_bits: float = Field(description="bits per reading of the compacted segments' data")
    store_code_bits: float = Field(description="bits per reading of the codes (sample's rows)")
    database_bits: float = Field(
        description="the stream's database share, bits per reading: at least its segments' "
        "bytes (a small stream may still fit in the pages its tables keep empty)"
    )
    database_pages_grown: bool = Field(
        description="whether the page count measured it (false: database_bits is the "
        "segments' bytes, a lower bound)"
    )
    paper_store_bits: float = Field(
        description="the paper's format: privatized float64 values, zstandard level 3"
    )
    paper_wire_bits: float = Field(description="the paper's transmission: 64 - gamma_min bits")
    store_vs_paper: float = Field(description="paper_store_bits / store_code_bits")
    compacted: float = Field(description="share of the readings in compressed rows (0: raw)")
    compression_ratio_cr: float = Field(description="paper Eq. (34) on the sample")
    transmission_ratio_tr: float = Field(description="paper Eq. (27)")


class StatsOut(BaseModel):
    stream: str
    readings: int
    messages: int
    devices: int
    active_devices: int = Field(description="devices heard from in the last hour")
    last_seen: datetime | None = Field(description="when the newest data arrived")
    bytes_received: int
    duplicates: int = Field(description="batches received again and dropped, all devices")
    sequence_resets: int = Field(description="batches stored after a sequence reset")
    missing: int = Field(description="sequence numbers never delivered, all devices")
    late: int = Field(description="batches stored out of order, all devices")
    wire_bytes_per_reading: float | None
    stored_readings: int = Field(description="readings held now (retention removes some)")
    store_bytes: dict[str, int] = Field(
        description="segments: their data; database: all in (every table and index, "
        "docs/server.md); sequence_state: the devices' sequence states (exactly-once and "
        "the missing count; part of the database figure)"
    )
    store_bits_per_reading: dict[str, float] | None = Field(description="store_bytes, bits/reading")
    database_bytes: dict[str, int] = Field(description="the database figure, table by table")
    rejects: dict[str, int]
    efficiency: EfficiencyOut | None = Field(description="null until data is stored")
    device_accounts: dict[str, dict[str, float]] = Field(
        default={},
        description="how the stream's devices' accounts over all their streams are spread "
        "(epsilon; last_7_days, last_30_days, last_365_days, since_first_seen): median, p90 "
        "and max over its devices, a device with nothing booked counting 0; empty with no "
        "device",
    )


class StatusOut(BaseModel):
    """A probe's answer (``live``, ``writer stopped``, ``ready``, ...)."""

    status: str


class Problem(BaseModel):
    """An error: ``detail`` says what was wrong and what was expected."""

    detail: str


#: Answers every route may give besides its own (documented so clients and fuzzers know).
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "token required"},
    403: {"model": Problem, "description": "wrong token"},
    404: {"model": Problem, "description": "no such stream or device"},
    503: {"model": Problem, "description": "database unavailable"},
}
#: The answer of a heavy read past its slots (zeal_server.api.costs; docs/server.md).
HEAVY: dict[int | str, dict[str, Any]] = {
    429: {
        "model": Problem,
        "description": "too many heavy reads at once (this one is heavy with the parameters "
        "given: see docs/server.md, 'Heavy reads'); ask again after Retry-After seconds",
    },
}


class SenderOut(BaseModel):
    device: str = Field(description="the name on the topic (as the client chose it)")
    messages: int = Field(description="rejected messages published under it")
    last: datetime = Field(description="when its latest rejected message arrived")
    reasons: dict[str, int] = Field(description="rejected messages by reason")
    known: bool = Field(
        description="whether it is a device of the stream (one that stored readings); false: "
        "it never stored anything (a misconfigured device, or an invented name)"
    )


class RejectsOut(BaseModel):
    """Who sent the rejected messages of a stream: the names with the most, the rest
    summed. The rejects table keeps a bounded number of names per stream whatever clients
    invent; beyond it they count under the name "*"."""

    stream: str
    senders: list[SenderOut] = Field(description="most rejected messages first")
    other_senders: int = Field(description="names beyond the limit")
    other_messages: int = Field(description="what those names sent, summed")


class ServerOut(BaseModel):
    """This server's identity as its agents know it."""

    server: str = Field(description="the installation id, named as server in what it signs")
    key: str = Field(description="its Ed25519 public key, base64 (zeal-edge --server-key)")
    endorsements: list[dict[str, Any]] = Field(
        description="the chain from its first key to this one, oldest first (empty: never "
        "rotated; docs/edge-agent.md)"
    )
    operator_token_required: bool = Field(
        description="whether writes need the operator token (ZEAL_OPERATOR_TOKEN); false: "
        "development mode, writes are open"
    )
    read_token_required: bool = Field(
        description="whether reads need a token (ZEAL_READ_TOKEN, or the operator token)"
    )
