"""The writer's side of the ChirpStack source: which stream and device an uplink is, and its
readings as the batch that device would have sent over MQTT.

Each uplink event (``zeal_server.broker.chirpstack.events``) is routed by its application and FPort
through the bindings (``store.bindings``: the port's own binding, else the application's
port 0), named by its DevEUI or ChirpStack device name as the binding says, decoded with
its stream's parameters (the LoRaWAN profile, ``zeal.lorawan``) and re-encoded as a
wire-v2 batch on ``zeal/v1/{stream}/{device}/up``. From there it takes the collector's one
ingest path: the same plausibility checks, enrolment, privacy policy, dedup and rejects
as an MQTT batch.

Dedup. The batch's sequence is the frame counter. What identifies its content
(``ingest.Original``) is the device's session address (DevAddr), the FPort and the
FRMPayload, not the reception time: the same event delivered twice, and a retransmission
of a frame (same counter, same session, heard again later), are duplicates, stored once.
A rejoin starts a new session, with a new DevAddr and the counter from 0: its frames are
stored, counted as sequence resets, and lose nothing. (An ABP device whose counter
restarts in the same session, with ChirpStack's frame-counter check turned off, has a
frame that repeats the payload the same counter carried earlier taken for a
retransmission: docs/server.md.)

What is not Zeal's is skipped, counted but not a reject: uplinks without application data
(FPort 0, an empty frame) and those of applications or ports no binding names (another
application on the same ChirpStack).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from zeal import ParameterError, WireError, Zeal
from zeal.mqtt.topics import data_topic
from zeal.protocol import check_name
from zeal_server import store
from zeal_server.broker.chirpstack.events import ChirpStackError, Uplink, parse_uplink, to_batch
from zeal_server.broker.sources import Translated
from zeal_server.errors import UndecodableError
from zeal_server.ingest import Ingest, Original, Outcome
from zeal_server.ingest.storing import FOREIGN
from zeal_server.ingest.undecodable import UNDECODABLE, contained
from zeal_server.store.db import error_text

__all__ = ["Translated", "Uplinks", "identity"]

log = logging.getLogger(__name__)

_DEV_EUI = re.compile(r"[0-9a-fA-F]{16}")
#: How often the bindings are read again, at most every this many seconds, when no change
#: was made through this process (another process's changes apply within it).
READ_EVERY = 2.0


def identity(uplink: Uplink) -> bytes:
    """What tells one frame's content from another's (module docstring): DevAddr, FPort,
    FRMPayload."""
    return b"".join((b"lorawan/1", uplink.dev_addr.encode(), bytes([uplink.f_port]), uplink.data))


class Uplinks:
    """Routes and translates uplink events for the writer thread (a ``sources.Translator``);
    the bindings are read again by ``keep_fresh`` when they changed here and every
    ``READ_EVERY`` seconds."""

    def __init__(self, read_every: float = READ_EVERY) -> None:
        self.bindings: dict[tuple[str, int], tuple[str, str]] = {}
        #: Uplinks skipped (not a reject): "no_data", "unbound".
        self.skipped: Counter[str] = Counter()
        self.read_every = read_every
        #: When the bindings were last read, and a failure to read them last logged
        #: (time.monotonic()).
        self.read_at = self.failure_logged = -1e18
        self._changed = threading.Event()
        self._changed.set()  # read before the first event is stored

    def load(self, session: Session) -> None:
        self.bindings = store.binding_map(session)

    def changed(self) -> None:
        self._changed.set()

    def keep_fresh(self, sessions: sessionmaker[Session]) -> None:
        """Read the bindings again when they changed here or every ``read_every`` seconds
        (a failure is logged once a minute, and the write that follows retries as usual)."""
        now = time.monotonic()
        if not self._changed.is_set() and now - self.read_at < self.read_every:
            return
        self._changed.clear()
        self.read_at = now
        try:
            with sessions() as session:
                self.load(session)
        except SQLAlchemyError as exc:
            if now - self.failure_logged >= 60:
                self.failure_logged = now
                log.error("could not read the LoRaWAN bindings: %s", error_text(exc))

    def route(self, uplink: Uplink) -> tuple[str, str] | None:
        """(stream, device naming) for the uplink's application and port, or None."""
        found = self.bindings.get((uplink.application_id, uplink.f_port))
        return found or self.bindings.get((uplink.application_id, 0))

    def _target(self, uplink: Uplink) -> tuple[str, str] | str:
        """(stream, device) of a bound uplink, the device "" when its name is not a valid
        Zeal name; "unbound" when no binding names its application and port."""
        route = self.route(uplink)
        if route is None:
            return "unbound"
        stream, naming = route
        device = uplink.dev_eui if naming == "dev_eui" else uplink.device_name
        try:
            return stream, check_name("device", device)
        except ParameterError:
            return stream, ""

    def translate(
        self, session: Session, ingest: Ingest, topic: str, payload: bytes, received_ms: int
    ) -> Translated | Outcome:
        """The event as a batch to store, or its outcome when it goes no further: rejected
        (counted in the rejects table, under the stream and device when known) or skipped."""
        try:
            uplink = contained("a ChirpStack event", lambda: parse_uplink(payload), ChirpStackError)
        except ChirpStackError as exc:
            if exc.reason == "no_data":
                self.skipped["no_data"] += 1
                return Outcome("skipped", "no_data")
            return ingest.reject(session, "", _dev_eui(topic), "bad_event", when=received_ms)
        except UndecodableError:
            return ingest.reject(session, "", _dev_eui(topic), UNDECODABLE, when=received_ms)
        target = self._target(uplink)
        if isinstance(target, str):
            self.skipped[target] += 1
            return Outcome("skipped", target)
        stream, device = target
        batch, reason = None, "bad_device_name"
        if device:
            try:
                batch = _batch(session, ingest, uplink, stream, device)
                reason = "unknown_stream"  # deleted by another process since bindings were read
            except (WireError, UndecodableError) as exc:
                reason = exc.reason
        if batch is None:
            return ingest.reject(session, stream, device, reason, when=received_ms)
        original = Original(identity(uplink), len(uplink.data), uplink.dev_eui)
        return Translated(data_topic(stream, device), batch, original)


def _batch(
    session: Session, ingest: Ingest, uplink: Uplink, stream: str, device: str
) -> bytes | None:
    """The uplink as a wire-v2 batch of `stream` (None: no such stream). A payload made with
    a policy another process gave the stream since it was cached is decoded again with
    the stream read afresh. Raises WireError, or UndecodableError (ingest.undecodable)."""
    params = ingest.stream_params(session, stream)
    if params is None:
        return None
    try:
        return _to_batch(uplink, params, stream, device)
    except WireError as exc:
        fresh = ingest.stream_params(session, stream, fresh=True)
        if exc.reason != FOREIGN or fresh is None or fresh is params:
            raise
        return _to_batch(uplink, fresh, stream, device)


def _to_batch(uplink: Uplink, params: Zeal, stream: str, device: str) -> bytes:
    """``to_batch``, an unexpected error in it raised as UndecodableError."""
    return contained(
        "a LoRaWAN payload",
        lambda: to_batch(uplink, params, stream=stream, device=device),
        WireError,
    )


def _dev_eui(topic: str) -> str:
    """The DevEUI an event's topic names, if it is one (for counting a bad event)."""
    parts = topic.split("/")
    if len(parts) == 6 and _DEV_EUI.fullmatch(parts[3]):
        return parts[3].lower()
    return ""
