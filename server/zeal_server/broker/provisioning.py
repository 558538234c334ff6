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
no longer works. ``provision_certificate(session, name, csr)`` makes the same client and
role without a password, for a client certificate the broker takes the device's login from
(zeal_server.broker.certificates); revoking such a device first revokes its certificates.
``provision_many(wanted, session)`` does either for a list of devices, some thirty to a
message, after checking every name and signing request of the list (a bad one makes none).

The commands travel as JSON on ``$CONTROL/dynamic-security/v1`` under the admin login made
by ``mosquitto_ctrl dynsec init`` (ZEAL_MQTT_ADMIN_USERNAME, ZEAL_MQTT_ADMIN_PASSWORD); the
answers come back on ``.../response``. The password is generated here (secrets), returned
once, and kept nowhere but in the broker (which stores a salted hash).

Errors: :class:`ProvisioningError` (``ValueError``) with ``kind`` one of ``invalid``,
``exists``, ``unknown``, ``off`` (no broker, or no admin login configured),
``unavailable`` (the broker is down, refuses the admin login, or does not answer).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from sqlalchemy.orm import Session

from zeal.errors import ParameterError
from zeal.mqtt.brokerurl import BrokerSettings
from zeal.mqtt.client import make_client
from zeal.mqtt.topics import CONFIG_FILTER, device_filters
from zeal.protocol import check_name
from zeal_server import store
from zeal_server.broker.certificates import DeviceCA
from zeal_server.errors import ProvisioningError
from zeal_server.logins import Outcome, Wanted
from zeal_server.settings import DeviceCASettings, ServerSettings

__all__ = [
    "DEFAULT_ACCESS",
    "BrokerAdmin",
    "Outcome",
    "ProvisioningError",
    "Revoked",
    "Wanted",
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
#: The commands of one message to the plugin, at most: deploy/mosquitto.conf's
#: max_packet_size (128 KiB) closes the connection of a larger one. A device's two commands
#: take 1.6 to 2 kB, so a message makes some 30 to 40 logins.
MESSAGE_BYTES = 64 * 1024


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
    """The admin of the server's broker (ZEAL_MQTT_ADMIN_URL or ZEAL_MQTT_URL,
    ZEAL_MQTT_ADMIN_*), with the device CA when one is set (ZEAL_DEVICE_CA*)."""
    if settings.broker is None:
        raise ProvisioningError("off", "ZEAL_MQTT_URL is off: there is no broker")
    return BrokerAdmin(
        settings.admin_broker or settings.broker,
        settings.admin_username,
        settings.admin_password,
        reserved=frozenset({"zeal-fleet-simulator", settings.broker.username or ""}) - {""},
        device_ca=settings.device_ca,
        listener=settings.broker,
    )


def _chunks(
    pairs: list[tuple[Wanted, store.Issued | None]],
) -> Iterator[list[tuple[Wanted, store.Issued | None]]]:
    """The list in parts whose commands fit in one message of MESSAGE_BYTES."""
    chunk: list[tuple[Wanted, store.Issued | None]] = []
    size = 0
    for pair in pairs:
        # A password's length (token_urlsafe(24)) in place of the one not yet drawn.
        grows = len(json.dumps(_login_commands(pair[0].device, "p" * 32))) + 2
        if chunk and size + grows > MESSAGE_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(pair)
        size += grows
    if chunk:
        yield chunk


def _login_commands(device: str, password: str | None) -> list[dict[str, Any]]:
    """The plugin commands that make a device's role and its client (with `password`, or
    none: it logs in with a certificate)."""
    client: dict[str, Any] = {
        "command": "createClient",
        "username": device,
        "roles": [{"rolename": role_name(device)}],
    }
    if password is not None:
        client["password"] = password
    return [
        {"command": "createRole", "rolename": role_name(device), "acls": device_acls(device)},
        client,
    ]


@dataclass(frozen=True)
class Revoked:
    """What revoking a device did."""

    device: str
    #: Its certificates revoked now.
    certificates: int = 0
    #: The broker refuses them already (checked with a probe revoked in the same list).
    confirmed: bool = False


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
        device_ca: DeviceCASettings | None = None,
        listener: BrokerSettings | None = None,
    ) -> None:
        self.broker, self.username, self.password = broker, username, password
        #: Logins that are not devices (the collector's, the admin's): never provisioned.
        self.reserved = reserved | {n for n in (username, broker.username) if n}
        self.timeout = timeout
        self.device_ca = device_ca
        #: The collector's listener (ZEAL_MQTT_URL): where a revocation is confirmed.
        self.listener = listener

    def provision(self, device: str) -> str:
        """Create the device's login; returns its password (shown once, stored nowhere)."""
        self._check(device)
        password = secrets.token_urlsafe(24)
        self._create(device, password)
        return password

    def provision_certificate(
        self, session: Session, device: str, csr: bytes | None = None
    ) -> store.Issued:
        """Create the device's login for a client certificate (no password): the
        certificate, for the key of `csr` (a PEM signing request made on the device) or
        for a key made here and returned once (zeal_server.broker.certificates).

        Commits the record of its serial before returning it: a certificate of the device
        CA opens the broker whatever the plugin holds, so none may leave without the record
        that lets revoking it put it in the list. Signed before the login is made (a bad
        request makes none); the login is deleted again when the record cannot be kept."""
        self._check(device)
        ca = self._ca()
        issued = ca.issue(device, csr)
        self._create(device, None)
        try:
            store.record_certificate(session, issued, int(time.time() * 1000))
            session.commit()
        except BaseException:
            session.rollback()
            with contextlib.suppress(ProvisioningError):
                self._delete(device)
            raise
        return issued

    def _ca(self) -> DeviceCA:
        if self.device_ca is None:
            raise ProvisioningError(
                "off",
                "device certificates need the device CA: ZEAL_DEVICE_CA, ZEAL_DEVICE_CA_KEY "
                "and ZEAL_DEVICE_CRL (deploy/README.md makes them)",
            )
        return DeviceCA(self.device_ca)

    def provision_many(
        self, wanted: Sequence[Wanted], session: Session | None = None
    ) -> Iterator[Outcome]:
        """Provision a list of devices, yielding each one's outcome in the list's order, a
        chunk at a time (one message to the plugin of at most MESSAGE_BYTES each).

        Everything that can be checked here is checked first: the names (valid, not the
        deployment's own, none twice) and, for certificates, the device CA and every
        signing request (all signed before any login is made): one bad entry raises
        ProvisioningError "invalid" naming every bad entry, and nothing is made. A device
        that has a login already is refused ("exists") and the others go on. The records of
        a chunk's certificates are committed (with `session`, needed for certificates)
        before its outcomes are yielded: none leaves without the record revoking needs. A
        broker that fails refuses the rest ("unavailable")."""
        issued = self._checked(wanted, session)
        failed: ProvisioningError | None = None
        for chunk in _chunks(list(zip(wanted, issued, strict=True))):
            if failed is not None:
                yield from (Outcome(one.device, refused=failed) for one, _ in chunk)
                continue
            try:
                outcomes = self._make_chunk(chunk, session)
            except ProvisioningError as exc:
                if exc.kind != "unavailable":
                    raise
                failed = ProvisioningError(
                    "unavailable",
                    f"{exc} (the logins of this part of the list may have been made: "
                    "`devices list` shows them; revoke those whose answer you lack)",
                )
                outcomes = [Outcome(one.device, refused=failed) for one, _ in chunk]
            yield from outcomes

    def _checked(
        self, wanted: Sequence[Wanted], session: Session | None
    ) -> list[store.Issued | None]:
        """Every entry checked (names, then the signing requests: each certificate signed);
        ProvisioningError "invalid" naming every bad entry. The certificates, in order."""
        problems: list[str] = []
        seen: set[str] = set()
        for number, one in enumerate(wanted, 1):
            try:
                self._check(one.device)
            except ProvisioningError as exc:
                problems.append(f"entry {number}: {exc}")
            if one.device in seen:
                problems.append(f"entry {number}: {one.device!r} is in the list twice")
            seen.add(one.device)
        signed = [w.certificate or w.csr is not None for w in wanted]
        issued: list[store.Issued | None] = [None] * len(wanted)
        if any(signed) and not problems:
            if session is None:
                raise ProvisioningError("off", "certificates need the server's database")
            ca = self._ca()
            for number, (one, sign) in enumerate(zip(wanted, signed, strict=True), 1):
                try:
                    issued[number - 1] = ca.issue(one.device, one.csr) if sign else None
                except ProvisioningError as exc:
                    problems.append(f"entry {number} ({one.device}): {exc}")
        if problems:
            shown = "; ".join(problems[:10])
            more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
            raise ProvisioningError("invalid", f"nothing provisioned: {shown}{more}")
        return issued

    def _make_chunk(
        self,
        chunk: Sequence[tuple[Wanted, store.Issued | None]],
        session: Session | None,
    ) -> list[Outcome]:
        passwords = [None if made else secrets.token_urlsafe(24) for _, made in chunk]
        commands: list[dict[str, Any]] = [
            {"command": "setDefaultACLAccess", "acls": DEFAULT_ACCESS}
        ]
        for (one, _), password in zip(chunk, passwords, strict=True):
            commands += _login_commands(one.device, password)
        answers = self.run(commands)
        outcomes: list[Outcome] = []
        for i, ((one, made), password) in enumerate(zip(chunk, passwords, strict=True)):
            error = answers[2 + 2 * i].get("error")  # createClient's (the role may exist)
            if error:
                refused = (
                    ProvisioningError("exists", f"device {one.device!r} is already provisioned")
                    if "exist" in error.lower()
                    else ProvisioningError("unavailable", f"the broker refused: {error}")
                )
                outcomes.append(Outcome(one.device, refused=refused))
            else:
                outcomes.append(Outcome(one.device, password=password, issued=made))
        records = [o.issued for o in outcomes if o.issued is not None]
        if records and session is not None:
            now = int(time.time() * 1000)
            try:
                for made in records:
                    store.record_certificate(session, made, now)
                session.commit()
            except BaseException:
                session.rollback()
                for made in records:
                    with contextlib.suppress(ProvisioningError):
                        self._delete(made.device)
                raise
        return outcomes

    def _create(self, device: str, password: str | None) -> None:
        answers = self.run(
            [
                {"command": "setDefaultACLAccess", "acls": DEFAULT_ACCESS},
                *_login_commands(device, password),
            ]
        )
        created = answers[2].get("error")
        if created:
            if "exist" in created.lower():
                raise ProvisioningError("exists", f"device {device!r} is already provisioned")
            raise ProvisioningError("unavailable", f"the broker refused: {created}")

    def revoke(self, device: str, session: Session | None = None) -> Revoked:
        """Revoke the device's certificates (with `session` and a device CA), then delete
        its login and role: the broker disconnects it if connected. A certificate is
        refused from the broker's next connection on once the broker has loaded the new
        revocation list, which is waited for before the connection is dropped
        (zeal_server.broker.certificates). The caller commits."""
        self._check(device)
        revoked = Revoked(device)
        if session is not None and self.device_ca is not None:
            count, confirmed = self._ca().revoke(session, device, self.listener)
            revoked = Revoked(device, count, confirmed)
        deleted = self._delete(device)
        if deleted:
            if "not found" not in deleted.lower():
                raise ProvisioningError("unavailable", f"the broker refused: {deleted}")
            if not revoked.certificates:
                raise ProvisioningError("unknown", f"device {device!r} is not provisioned")
        return revoked

    def _delete(self, device: str) -> str | None:
        """Delete the device's client and role; the broker's error about the client, if any."""
        answers = self.run(
            [
                {"command": "deleteClient", "username": device},
                {"command": "deleteRole", "rolename": role_name(device)},
            ]
        )
        error: str | None = answers[0].get("error")
        return error

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
