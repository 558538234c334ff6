"""Device logins through the broker's own mechanism: Mosquitto's dynamic security plugin.

``provision(name)`` creates a broker client ``name`` with a generated password and a role
of its own, ``zeal-device-{name}``, that allows exactly what a device does (topics:
zeal.mqtt.topics) and denies the rest explicitly::

    publish    zeal/v1/+/{name}/up         its data, to any stream
    publish    zeal/v1/+/{name}/presence   its presence (retained, Last Will)
    subscribe  zeal/v1/+/config            the stream configurations (and receive them)
    subscribe  zeal/v1/+/{name}/notice     the collector's notices to it (and receive them)
    subscribe  zeal/v1/+/{name}/presence   its own presence (one agent per device id)
    deny       every other subscription and every other message, $SYS included

The denials are in the role because the plugin's defaults do not deny: a default of
"deny" makes the plugin *defer* to the password file's ACL, which in Mosquitto 2.0 grants
every subscription (it checks reads, per message), and the plugin's own default lets a
known client receive whatever it subscribed to. Without them a provisioned login could
subscribe to ``#`` and receive every device's batches and presence. ``provision`` also sets
the plugin's default access explicitly (``setDefaultACLAccess``: nothing but unsubscribing
is allowed by default), and :meth:`BrokerAdmin.harden` adds the denials to the roles of
devices provisioned before them (``zeal-server devices harden``). ``revoke(name)`` deletes
the client and its role: the broker disconnects a connected device at once, and the login
no longer works.

The commands travel as JSON on ``$CONTROL/dynamic-security/v1`` under the admin login made
by ``mosquitto_ctrl dynsec init`` (ZEAL_MQTT_ADMIN_USERNAME, ZEAL_MQTT_ADMIN_PASSWORD); the
answers come back on ``.../response``. The password is generated here (secrets), returned
once, and kept nowhere but in the broker (which stores a salted hash).

Errors: :class:`ProvisioningError` (``ValueError``) with ``kind`` one of ``invalid``,
``exists``, ``unknown``, ``off`` (no broker, or no admin login configured),
``unavailable`` (the broker is down, refuses the admin login, or does not answer).
"""

from __future__ import annotations

import json
import secrets
import threading
from typing import Any

import paho.mqtt.client as mqtt

from zeal.errors import ParameterError
from zeal.mqtt.brokerurl import BrokerSettings
from zeal.mqtt.client import make_client
from zeal.mqtt.topics import CONFIG_FILTER, device_filters
from zeal.protocol import check_name
from zeal_server.errors import ProvisioningError
from zeal_server.settings import ServerSettings

__all__ = [
    "DEFAULT_ACCESS",
    "BrokerAdmin",
    "ProvisioningError",
    "admin_for",
    "device_acls",
    "role_name",
]

CONTROL = "$CONTROL/dynamic-security/v1"
RESPONSE = f"{CONTROL}/response"


def role_name(device: str) -> str:
    """The role that holds one device's access rules."""
    return f"zeal-device-{device}"


#: The plugin's default access, set explicitly (mosquitto_ctrl's init allows receiving).
DEFAULT_ACCESS: list[dict[str, Any]] = [
    {"acltype": "publishClientSend", "allow": False},
    {"acltype": "publishClientReceive", "allow": False},
    {"acltype": "subscribe", "allow": False},
    {"acltype": "unsubscribe", "allow": True},
]
#: Names of the deployment's own logins (collectors, the simulator, the admin): a device
#: provisioned under one would shadow a password-file user (deploy/mosquitto/acl).
RESERVED_PREFIX = "zeal-"
#: Rule priorities in a device role: the plugin takes the first match, highest first.
ALLOW, DENY = 10, 0


def device_acls(device: str) -> list[dict[str, Any]]:
    """The dynamic security ACL entries of a device's role (see the module docstring)."""
    own = device_filters(device)
    allowed = [
        ("publishClientSend", own["data"]),
        ("publishClientSend", own["presence"]),
        *(
            (kind, topic)
            for topic in (CONFIG_FILTER, own["notice"], own["presence"])
            for kind in ("subscribePattern", "publishClientReceive")
        ),
    ]
    denied = [
        (kind, topic)
        for kind in ("subscribePattern", "publishClientReceive", "publishClientSend")
        for topic in ("#", "$SYS/#")
    ]
    return [
        {"acltype": kind, "topic": topic, "priority": ALLOW, "allow": True}
        for kind, topic in allowed
    ] + [
        {"acltype": kind, "topic": topic, "priority": DENY, "allow": False}
        for kind, topic in denied
    ]


def admin_for(settings: ServerSettings) -> BrokerAdmin:
    """The admin of the server's broker (ZEAL_MQTT_URL, ZEAL_MQTT_ADMIN_*)."""
    if settings.broker is None:
        raise ProvisioningError("off", "ZEAL_MQTT_URL is off: there is no broker")
    return BrokerAdmin(
        settings.broker,
        settings.admin_username,
        settings.admin_password,
        reserved=frozenset({"zeal-fleet-simulator"}),
    )


class BrokerAdmin:
    """Sends dynamic security commands to the broker with the admin login."""

    def __init__(
        self,
        broker: BrokerSettings,
        username: str | None,
        password: str | None,
        *,
        reserved: frozenset[str] = frozenset(),
        timeout: float = 10.0,
    ) -> None:
        self.broker, self.username, self.password = broker, username, password
        #: Logins that are not devices (the collector's, the admin's): never provisioned.
        self.reserved = reserved | {n for n in (username, broker.username) if n}
        self.timeout = timeout

    def provision(self, device: str) -> str:
        """Create the device's login; returns its password (shown once, stored nowhere)."""
        self._check(device)
        password = secrets.token_urlsafe(24)
        answers = self.run(
            [
                {"command": "setDefaultACLAccess", "acls": DEFAULT_ACCESS},
                {
                    "command": "createRole",
                    "rolename": role_name(device),
                    "acls": device_acls(device),
                },
                {
                    "command": "createClient",
                    "username": device,
                    "password": password,
                    "roles": [{"rolename": role_name(device)}],
                },
            ]
        )
        created = answers[2].get("error")
        if created:
            if "exist" in created.lower():
                raise ProvisioningError("exists", f"device {device!r} is already provisioned")
            raise ProvisioningError("unavailable", f"the broker refused: {created}")
        return password

    def revoke(self, device: str) -> None:
        """Delete the device's login and role; the broker disconnects it if connected."""
        self._check(device)
        answers = self.run(
            [
                {"command": "deleteClient", "username": device},
                {"command": "deleteRole", "rolename": role_name(device)},
            ]
        )
        deleted = answers[0].get("error")
        if deleted:
            if "not found" in deleted.lower():
                raise ProvisioningError("unknown", f"device {device!r} is not provisioned")
            raise ProvisioningError("unavailable", f"the broker refused: {deleted}")

    def provisioned(self) -> list[str]:
        """The devices with a login made here (those with a zeal-device-* role)."""
        answer = self.run([{"command": "listRoles", "count": -1, "offset": 0}])[0]
        roles = answer.get("data", {}).get("roles", [])
        prefix = role_name("")
        return sorted(r.removeprefix(prefix) for r in roles if r.startswith(prefix))

    def harden(self) -> list[str]:
        """Set the plugin's default access and give every provisioned device's role the
        rules of :func:`device_acls` it lacks (roles made before the denials existed);
        returns the devices whose role changed."""
        devices = self.provisioned()
        commands: list[dict[str, Any]] = [
            {"command": "setDefaultACLAccess", "acls": DEFAULT_ACCESS}
        ]
        owners: list[str] = []
        for device in devices:
            for acl in device_acls(device):
                commands.append({"command": "addRoleACL", "rolename": role_name(device), **acl})
                owners.append(device)
        answers = self.run(commands)
        if answers[0].get("error"):
            raise ProvisioningError("unavailable", f"the broker refused: {answers[0]['error']}")
        changed: set[str] = set()
        for owner, answer in zip(owners, answers[1:], strict=True):
            error = answer.get("error")
            if not error:
                changed.add(owner)
            elif "already exists" not in error.lower():
                raise ProvisioningError("unavailable", f"the broker refused: {error}")
        return sorted(changed)

    def _check(self, device: str) -> None:
        try:
            check_name("device", device)
        except ParameterError as exc:
            raise ProvisioningError("invalid", str(exc)) from None
        if device in self.reserved or device.startswith(RESERVED_PREFIX):
            raise ProvisioningError(
                "invalid",
                f"{device!r} is, or could be, the login of a server component, not a device "
                f"name (names starting with {RESERVED_PREFIX!r} are the deployment's own: "
                "zeal-collector, zeal-collector-2, zeal-fleet-simulator, zeal-admin)",
            )

    def run(self, commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send commands in one message; the broker's answers, one per command, in order."""
        if not self.username:
            raise ProvisioningError(
                "off",
                "device provisioning needs the broker's admin login "
                "(ZEAL_MQTT_ADMIN_USERNAME and ZEAL_MQTT_ADMIN_PASSWORD)",
            )
        exchange = _Exchange(commands)
        client = make_client(
            self.broker,
            f"zeal-admin-{exchange.tag}",  # under the admin login (owned_client_id)
            username=self.username,
            password=self.password,
        )
        client.on_connect = exchange.on_connect
        client.on_subscribe = exchange.on_subscribe
        client.on_message = exchange.on_message
        try:
            client.connect(self.broker.host, self.broker.port, keepalive=30)
        except OSError as exc:
            raise ProvisioningError(
                "unavailable", f"cannot reach the broker at {self.broker.url}: {exc}"
            ) from None
        client.loop_start()
        try:
            if not exchange.done.wait(self.timeout):
                raise ProvisioningError(
                    "unavailable",
                    f"no answer from the broker's dynamic security plugin at {self.broker.url} "
                    f"within {self.timeout:g} s (is the plugin loaded?)",
                )
        finally:
            client.disconnect()
            client.loop_stop()
        if exchange.failure:
            raise ProvisioningError("unavailable", exchange.failure)
        return exchange.answers()


class _Exchange:
    """One request to the plugin and its answers, matched by correlation data (paho
    callbacks, run in paho's network thread)."""

    def __init__(self, commands: list[dict[str, Any]]) -> None:
        self.tag = secrets.token_hex(8)
        for number, command in enumerate(commands):
            command["correlationData"] = f"{self.tag}-{number}"
        self.commands = commands
        self.received: dict[str, dict[str, Any]] = {}
        self.done = threading.Event()
        self.failure = ""

    def _fail(self, why: str) -> None:
        self.failure = why
        self.done.set()

    def on_connect(self, client: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            self._fail(f"the broker refused the admin login: {reason}")
        else:
            client.subscribe(RESPONSE, qos=1)

    def on_subscribe(self, client: mqtt.Client, _u: Any, _mid: int, codes: Any, _p: Any) -> None:
        if any(code.is_failure for code in codes):
            self._fail(f"the admin login may not read {RESPONSE}")
        else:
            client.publish(CONTROL, json.dumps({"commands": self.commands}), qos=1)

    def on_message(self, _client: mqtt.Client, _u: Any, message: mqtt.MQTTMessage) -> None:
        try:
            responses = json.loads(message.payload)["responses"]
        except (ValueError, KeyError, TypeError):
            return
        for response in responses:
            if str(response.get("correlationData", "")).startswith(self.tag):
                self.received[response["correlationData"]] = response
        if len(self.received) == len(self.commands):
            self.done.set()

    def answers(self) -> list[dict[str, Any]]:
        return [self.received[f"{self.tag}-{n}"] for n in range(len(self.commands))]
