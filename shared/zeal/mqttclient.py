"""The one way Zeal makes an MQTT client: paho, MQTT v5 or 3.1.1, the broker's credentials and TLS
set up from :class:`zeal.brokerurl.BrokerSettings`. The agent, the collector and device
provisioning all call :func:`make_client`, so TLS and credentials cannot drift apart.

Needs paho-mqtt (the ``mqtt`` extra: ``pip install zeal[mqtt]``); ``import zeal`` does not
load this module, so the core stays numpy-only.
"""

from __future__ import annotations

import ssl

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from zeal.brokerurl import BrokerSettings

__all__ = ["connect_persistent", "make_client"]


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
    admin logs in with its own). With ``mqtts://`` it verifies the broker's certificate
    and host name (TLS 1.2 or newer, the CA file or the system's), and presents the
    client certificate when one is set. Reconnects back off from 1 s to 30 s.
    """
    v311 = broker.protocol == "3.1.1"
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=MQTTProtocolVersion.MQTTv311 if v311 else MQTTProtocolVersion.MQTTv5,
        manual_ack=manual_ack,
        clean_session=(not persistent) if v311 else None,
    )
    client.reconnect_delay_set(min_delay=1, max_delay=30)
    user = username if username is not None else broker.username
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
