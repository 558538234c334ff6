"""The one way Zeal makes an MQTT client: paho, MQTT v5, the broker's credentials and TLS
set up from :class:`zeal.brokerurl.BrokerSettings`. The agent, the collector and device
provisioning all call :func:`make_client`, so TLS and credentials cannot drift apart.

Needs paho-mqtt (the ``mqtt`` extra: ``pip install zeal[mqtt]``); ``import zeal`` does not
load this module, so the core stays numpy-only.
"""

from __future__ import annotations

import ssl

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from zeal.brokerurl import BrokerSettings

__all__ = ["make_client"]


def make_client(
    broker: BrokerSettings,
    client_id: str,
    *,
    manual_ack: bool = False,
    username: str | None = None,
    password: str | None = None,
) -> mqtt.Client:
    """A paho client (callback API 2, MQTT v5) for `broker`, not yet connected.

    Credentials are the broker settings' unless `username` is given (the provisioning
    admin logs in with its own). With ``mqtts://`` it verifies the broker's certificate
    and host name (TLS 1.2 or newer, the CA file or the system's), and presents the
    client certificate when one is set. Reconnects back off from 1 s to 30 s.
    """
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=MQTTProtocolVersion.MQTTv5,
        manual_ack=manual_ack,
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
