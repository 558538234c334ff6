"""What an agent accepts and how it says why it stops: its options, the test a stream
configuration must pass before it is adopted, and the text of a halt."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from zeal import ParameterError
from zeal.mqtt.streamconfig import StreamConfig, read_config
from zeal.policy import DEFAULT_DEVICE_MAX_EPSILON_PER_DAY, DEFAULT_MAX_EPSILON_PER_DAY
from zeal.protocol import EPSILON_CEILING
from zeal.signed import CONFIG_PURPOSE
from zeal_edge.budget import BudgetPolicy
from zeal_edge.errors import UnverifiedError
from zeal_edge.records import Halt
from zeal_edge.trust import verified

__all__ = [
    "AgentOptions",
    "Throttle",
    "config_from_file",
    "halted_text",
    "refusal",
    "screened",
    "unpinned",
]


class Throttle:
    """Lets a repeated log message through at most once per `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._last: dict[str, float] = {}

    def ready(self, key: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(key, -1e18) >= self.seconds:
            self._last[key] = now
            return True
        return False


@dataclass
class AgentOptions:
    """What the agent needs besides its connection (see settings.py for the meaning)."""

    stream: str
    device: str
    data_dir: Path
    batch: int = 60
    interval: float = 60.0
    params_file: Path | None = None
    budget: BudgetPolicy = field(default_factory=lambda: BudgetPolicy(None, 86400))
    wait_for_params: float = float("inf")
    #: Wait for a stream that no server serves yet instead of ending (--wait).
    wait: bool = False
    #: Refuse a configuration whose privacy loss per reading (the realized epsilon where the
    #: sampler's is known, else the nominal one) exceeds this.
    max_epsilon: float = EPSILON_CEILING
    #: Refuse a configuration whose privacy policy (epsilon per device per UTC day) exceeds
    #: this.
    max_epsilon_per_day: float = DEFAULT_MAX_EPSILON_PER_DAY
    #: The device's daily cap across its streams, as its server holds it (zeal.policy: the
    #: device cap; None: none): the agent keeps within it (zeal_edge.device).
    device_max_epsilon_per_day: float | None = DEFAULT_DEVICE_MAX_EPSILON_PER_DAY
    #: Its caps over any 30 and any 365 consecutive UTC days (horizon -> epsilon; None or
    #: left out: none).
    device_rolling_caps: dict[int, float | None] = field(default_factory=dict)
    #: Adopt only the configuration with this parameter fingerprint (16 hex digits).
    pin: str | None = None
    #: The server's public key its configurations and notices must verify under, given
    #: with the device's login (None: the key pinned in the outbox, if any).
    server_key: str | None = None
    #: On a halt: "exit" (status 3) or "wait" until the server releases the stream.
    on_halt: str = "exit"
    #: With no server key given or pinned, trust the key of the first signed configuration
    #: (--trust-first-use); else such an agent adopts nothing.
    trust_first_use: bool = False


def refusal(config: StreamConfig, options: AgentOptions) -> str | None:
    """Why this agent must not adopt `config` (its pin, its ceilings on epsilon per reading
    and per day), or None.

    Whoever can retain a configuration on the broker (a broker without ACLs, a leaked
    collector login) could otherwise hand agents epsilon 20 and read their readings off the
    wire. A refused configuration is never used: nothing is privatized with it.
    """
    fingerprint = config.params.fingerprint.hex()
    if options.pin is not None and fingerprint != options.pin:
        return (
            f"its fingerprint {fingerprint} is not the pinned {options.pin} (--pin): the "
            "stream's parameters changed, or someone else published them"
        )
    loss = max(config.params.epsilon, config.params.realized_epsilon or 0.0)
    if loss > options.max_epsilon:
        return (
            f"its privacy loss per reading, epsilon {loss:.6g}, exceeds this agent's ceiling "
            f"{options.max_epsilon:g} (--max-epsilon): raise the ceiling only if the "
            "operator really chose it"
        )
    policy = config.params.max_epsilon_per_day
    if policy is not None and policy > options.max_epsilon_per_day:
        return (
            f"its privacy policy, {policy:g} epsilon per device per UTC day, exceeds this "
            f"agent's ceiling {options.max_epsilon_per_day:g} (--max-epsilon-per-day): raise "
            "the ceiling only if the operator really chose it"
        )
    return None


def unpinned(stream: str, origin: str, config: StreamConfig) -> tuple[str, str]:
    """The halt for a configuration whose origin is not the pinned one."""
    server, created = origin.split("/", 1)
    if config.server != server:
        return (
            "foreign_server",
            f"the configuration of stream {stream} on the broker now comes from server "
            f"{config.server}, not from server {server} that configured this agent (two "
            "servers on one broker, or someone who may retain configurations)",
        )
    return (
        "stream_recreated",
        f"stream {stream} was created anew (at {config.created_ms}, not {created} as when "
        f"this agent adopted it), with parameters {config.params!r}",
    )


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def halt_cause(options: AgentOptions, halt: Halt) -> str:
    """What halted the stream, and since when (a sentence)."""
    return (
        f"stream {options.stream} is no longer accepted by its server ({halt.reason}, since "
        f"{_when(halt.since_ms)}): {halt.message}."
    )


def halted_text(options: AgentOptions, halt: Halt) -> str:
    fetch = (
        f" (with --params: save the new stream's configuration to {options.params_file})"
        if options.params_file is not None
        else ""
    )
    return (
        f"{halt_cause(options, halt)} Stopped: no further reading of device "
        f"{options.device} is privatized or sent, and a restart refuses too. Once the "
        f"operator has checked the stream's configuration{fetch}, `zeal-edge resume "
        f"--data-dir {options.data_dir}` clears the halt, and the agent adopts the "
        "configuration it finds next."
    )


def screened(config: StreamConfig, options: AgentOptions) -> StreamConfig | str:
    """A configuration published on the broker, or why ``refusal`` refuses it."""
    why = refusal(config, options)
    if why is not None:
        return f"refused the configuration of stream {config.stream}: {why}"
    return _warn_if_unbounded(config, options)


def config_from_file(options: AgentOptions) -> StreamConfig:
    """The configuration given with --params, checked like one from the broker
    (ParameterError when it cannot be read or is refused). A signed one (as
    ``GET /api/v1/streams/NAME/config`` gives it) must verify, under --server-key when
    given: its key is then the one the server's notices are checked with."""
    assert options.params_file is not None
    try:
        text = options.params_file.read_text()
    except OSError as exc:
        raise ParameterError(f"cannot read --params {options.params_file}: {exc}") from exc
    config = read_config(text, stream=options.stream)
    if config.key is not None or options.server_key is not None:
        try:
            verified(text.encode(), CONFIG_PURPOSE, options.server_key, first_use=True)
        except UnverifiedError as exc:
            raise ParameterError(
                f"refusing --params {options.params_file}: {exc} (altered, or not from the "
                "server whose key was given)"
            ) from None
    why = refusal(config, options)
    if why is not None:
        raise ParameterError(f"refusing --params {options.params_file}: {why}")
    return _warn_if_unbounded(config, options)


def _warn_if_unbounded(config: StreamConfig, options: AgentOptions) -> StreamConfig:
    if config.params.max_epsilon_per_day is None and options.budget.cap_micro is None:
        logging.getLogger(__name__).warning(
            "stream %s has no privacy policy (it was made before policies) and no "
            "--budget-cap is set: what this device spends per day is not bounded",
            config.stream,
        )
    return config
