"""The one way Zeal makes an MQTT client: paho, MQTT v5 or 3.1.1, the broker's credentials and TLS
set up from :class:`zeal.mqtt.brokerurl.BrokerSettings`. The agent, the collector and device
provisioning all call :func:`make_client`, so TLS and credentials cannot drift apart.

Needs paho-mqtt (the ``mqtt`` extra: ``pip install zeal[mqtt]``); ``import zeal`` does not
load this module, so the core stays numpy-only.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
from collections.abc import Iterable

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.client import PUBACK
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from zeal.mqtt.brokerurl import BrokerSettings

__all__ = ["acknowledge", "connect_persistent", "flush", "make_client", "owned_client_id"]

#: paho 2.1's socket that wakes the network thread, and its method that queues a packet
#: to write (both private: see ``acknowledge``).
_WAKE = "_sockpairW"
_QUEUE = "_packet_queue"
#: A PUBACK's fixed header (type 4, remaining length 2) before its 16-bit message id.
_PUBACK_HEADER = (PUBACK << 24) | (2 << 16)


def owned_client_id(login: str | None, name: str) -> str:
    """The client id `name` under `login`: the login's own (the login itself, or the login,
    ':' and more) as the deployment's broker requires (deploy/mosquitto's plugin binds
    client ids to logins), so that no other login can take its session; `name` as it is
    without a login or when it is the login's already."""
    if not login or name == login or name.startswith(login + ":"):
        return name
    return f"{login}:{name}"


def make_client(
    broker: BrokerSettings,
    client_id: str,
    *,
    manual_ack: bool = False,
    persistent: bool = False,
    username: str | None = None,
    password: str | None = None,
) -> mqtt.Client:
    """A paho client (callback API 2, MQTT v5 or 3.1.1 as `broker` says), not yet connected.

    `persistent` asks for a session the broker keeps across connections: under 3.1.1 that
    is the client's clean-session flag, set here; under v5 the caller connects with
    ``clean_start=False`` and a session expiry interval.

    Credentials are the broker settings' unless `username` is given (the provisioning
    admin logs in with its own). The client id is made the login's own
    (:func:`owned_client_id`). With ``mqtts://`` it verifies the broker's certificate
    and host name (TLS 1.2 or newer, the CA file or the system's), and presents the
    client certificate when one is set. Reconnects back off from 1 s to 30 s.
    """
    v311 = broker.protocol == "3.1.1"
    user = username if username is not None else broker.username
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=owned_client_id(user, client_id),
        protocol=MQTTProtocolVersion.MQTTv311 if v311 else MQTTProtocolVersion.MQTTv5,
        manual_ack=manual_ack,
        clean_session=(not persistent) if v311 else None,
    )
    client.reconnect_delay_set(min_delay=1, max_delay=30)
    if user is not None:
        client.username_pw_set(user, password if username is not None else broker.password)
    if broker.tls:
        client.tls_set(
            ca_certs=broker.ca_file,
            certfile=broker.cert_file,
            keyfile=broker.key_file,
            tls_version=ssl.PROTOCOL_TLS_CLIENT,
        )
    return client


def connect_persistent(
    client: mqtt.Client, broker: BrokerSettings, *, session_expiry: int, receive_maximum: int
) -> None:
    """Connect `client` (made with ``persistent=True``) in the background to a session the
    broker keeps: under v5 with ``clean_start=False``, the session expiry interval and
    Receive Maximum (the most unacknowledged QoS 1 messages the broker may send us);
    under 3.1.1 the clean-session flag already says it, and there is no Receive Maximum."""
    if broker.protocol == "3.1.1":
        client.connect_async(broker.host, broker.port, keepalive=broker.keepalive)
        return
    properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    properties.SessionExpiryInterval = session_expiry
    properties.ReceiveMaximum = receive_maximum
    client.connect_async(
        broker.host,
        broker.port,
        keepalive=broker.keepalive,
        clean_start=False,
        properties=properties,
    )


def acknowledge(client: mqtt.Client, messages: Iterable[tuple[int, int]]) -> None:
    """Acknowledge (mid, qos) pairs of a client with manual acknowledgement, waking its
    network thread once for all of them.

    ``Client.ack`` wakes the network thread at every call, and from another thread each
    wake-up hands Python's interpreter lock back and forth (deploy/SCALING.md has the
    cost). So the QoS 1 PUBACKs (4 bytes each, the same under MQTT v5 and 3.1.1: success
    needs no reason code) are queued as one write, in the order given, through paho 2.1's private
    ``_packet_queue``; the wake-up socket is its private ``_sockpairW``. constraints.txt
    pins paho-mqtt and tests/shared/test_mqtt_client.py checks that both are there; while
    the socket is set aside, packets queued by any thread wait for that last wake-up.
    Without them, the messages are acknowledged one by one as usual. QoS 2 messages are
    completed with ``Client.ack``; QoS 0 ones need nothing.
    """
    pairs = list(messages)
    queue = getattr(client, _QUEUE, None)
    wake = getattr(client, _WAKE, None)
    if wake is not None:
        setattr(client, _WAKE, None)
    try:
        qos1 = [mid for mid, qos in pairs if qos == 1]
        if queue is not None and qos1:
            packets = np.asarray(qos1, dtype=np.uint32) | np.uint32(_PUBACK_HEADER)
            queue(PUBACK, packets.astype(">u4").tobytes(), 0, 0)
            pairs = [(mid, qos) for mid, qos in pairs if qos != 1]
        for mid, qos in pairs:
            client.ack(mid, qos)
    finally:
        if wake is not None:
            setattr(client, _WAKE, wake)
            with contextlib.suppress(OSError):  # full (it is awake anyway) or closed with it
                wake.send(b"0")


def flush(client: mqtt.Client, unused_filter: str, timeout: float = 5.0) -> bool:
    """Wait until the broker has read everything the client sent so far: it answers an
    unsubscription from `unused_filter` (a filter the client never subscribed to) only
    after the packets before it. A client that acknowledged messages and disconnects at
    once loses the acknowledgements still on their way (the broker resends those
    messages); this one round trip first keeps them. True if the broker answered in time."""
    answered = threading.Event()
    before = client.on_unsubscribe
    client.on_unsubscribe = lambda *_: answered.set()
    try:
        client.unsubscribe(unused_filter)
        return answered.wait(timeout)
    finally:
        client.on_unsubscribe = before
