"""``zeal-server devices ...``: device logins in the broker (zeal_server.broker.provisioning)
from the command line. Errors are ProvisioningError, printed in one line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from zeal_server import store
from zeal_server.broker.provisioning import BrokerAdmin, admin_for
from zeal_server.cli.bulk import provision_list
from zeal_server.cli.common import Commands, command, fail
from zeal_server.errors import ProvisioningError, StoreError
from zeal_server.settings import ServerSettings
from zeal_server.store.db import make_engine, session_factory

__all__ = ["add_parsers", "run"]

BROKER = (
    "ZEAL_MQTT_URL",
    "ZEAL_MQTT_ADMIN_URL",
    "ZEAL_MQTT_ADMIN_USERNAME",
    "ZEAL_MQTT_ADMIN_PASSWORD",
)
#: The device CA (certificates) and the database (the record of their serials, the key).
CERTIFICATES = ("ZEAL_DEVICE_CA", "ZEAL_DEVICE_CA_KEY", "ZEAL_DEVICE_CRL", "ZEAL_DEVICE_CERT_DAYS")


def add_parsers(commands: Commands) -> None:
    """The ``devices`` command and its actions."""
    devices = command(
        commands,
        "devices",
        "device logins in the broker (Mosquitto's dynamic security plugin)",
        variables=BROKER,
    )
    sub = devices.add_subparsers(dest="action", required=True, metavar="ACTION")
    provision = command(
        sub,
        "provision",
        "create a broker login for a device: it may publish only its own data and presence "
        "and read the configurations and its notices; prints its password once, and the "
        "server's key the device is to check what the server signs with; with "
        "--certificate, a client certificate instead of a password",
        variables=(*BROKER, *CERTIFICATES, "ZEAL_DATABASE_URL", "ZEAL_DATA_DIR"),
    )
    provision.add_argument(
        "name",
        nargs="?",
        help="the device id (1-64 letters, digits, '_', '.' or '-'); or --from a list",
    )
    provision.add_argument(
        "--from",
        dest="listed",
        metavar="FILE",
        help="provision every device of a list (- for standard input): one per line, its "
        "id, and optionally the path of its certificate signing request (relative to the "
        "list's folder; such a device gets a certificate); '#' starts a comment. Needs "
        "--out; the whole list is checked before any login is made",
    )
    provision.add_argument(
        "--out",
        metavar="DIR",
        help="with --from: where each device's login goes, DIR/NAME/login.env (ZEAL_DEVICE, "
        "its password or certificate paths, ZEAL_SERVER_KEY) beside device.crt and "
        "device.key, and DIR/logins.csv (no secrets); files readable by you alone. A device "
        "whose DIR/NAME exists is skipped, so running the same command again finishes an "
        "interrupted list",
    )
    provision.add_argument(
        "--certificate",
        action="store_true",
        help="log in with a client certificate (its common name is the login), no password: "
        "printed with its private key, made here and shown once, unless --csr is given",
    )
    provision.add_argument(
        "--csr",
        metavar="FILE",
        help="the device's certificate signing request (PEM; - for standard input), made on "
        "the device so that its private key never leaves it (openssl req -new -subj "
        "/CN=NAME ...); implies --certificate",
    )
    revoke = command(
        sub,
        "revoke",
        "delete a device's broker login and revoke its certificates: a connected device is "
        "disconnected, and it can no longer connect (its stored data stays; DELETE "
        ".../devices/NAME removes it)",
        variables=(*BROKER, *CERTIFICATES, "ZEAL_DATABASE_URL", "ZEAL_DATA_DIR"),
    )
    revoke.add_argument("name", help="the device id")
    command(sub, "list", "the devices with a broker login made here", variables=BROKER)
    command(
        sub,
        "harden",
        "set the plugin's default access to deny and add the explicit denials to the roles "
        "of devices provisioned before them (such a login could subscribe to '#' and "
        "receive other devices' traffic); safe to run again",
        variables=BROKER,
    )


def run(settings: ServerSettings, args: argparse.Namespace) -> int:
    """Carry out one ``devices`` action, printing its result; exit status 0, or 2 with the
    reason in one line."""
    try:
        _carry_out(settings, args)
    except ProvisioningError as exc:
        return fail(str(exc))
    return 0


def _server_key(settings: ServerSettings) -> str:
    """The public key of the server whose database is ZEAL_DATABASE_URL (ProvisioningError
    when it cannot be read: a device given no key would trust nothing)."""
    engine = make_engine(settings.database_url)
    try:
        with session_factory(engine)() as session:
            return store.signer(session).public
    except (SQLAlchemyError, StoreError) as exc:
        raise ProvisioningError(
            "unavailable",
            f"cannot read the server's key from its database ({exc}); run this where "
            "ZEAL_DATABASE_URL reaches the server's database (the device needs the key "
            "with its login)",
        ) from None
    finally:
        engine.dispose()


def _request(path: str) -> bytes:
    try:
        return sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise ProvisioningError("invalid", f"cannot read --csr {path}: {exc}") from None


def _carry_out(settings: ServerSettings, args: argparse.Namespace) -> None:
    admin = admin_for(settings)
    if args.action == "list":
        names = list(admin.provisioned())
        if not names:
            print("no device has a broker login made here (zeal-server devices provision NAME)")
        for name in names:
            print(name)
    elif args.action == "harden":
        changed = admin.harden()
        print(f"default access: deny; roles given the denials: {len(changed)}")
        for name in changed:
            print(f"  {name}")
    elif args.action == "provision" and (args.listed is not None or args.out is not None):
        provision_list(settings, admin, args, _server_key)
    elif args.action == "provision" and args.name is None:
        raise ProvisioningError("invalid", "name a device, or give a list with --from FILE")
    elif args.action == "provision" and (args.certificate or args.csr):
        _provision_certificate(settings, admin, args.name, args.csr)
    elif args.action == "provision":
        key = _server_key(settings)  # before the login is made: a failure makes none
        password = admin.provision(args.name)
        print(
            f"provisioned device {args.name} on {admin.broker.url}\n"
            f"username: {args.name}\npassword: {password}\nserver key: {key}\n"
            "(the password is shown once: give it to the device as ZEAL_MQTT_PASSWORD; it is "
            "stored nowhere but hashed in the broker. Give it the server key too, as "
            "ZEAL_SERVER_KEY or --server-key: it believes only what that key signed)"
        )
    else:
        _revoke(settings, admin, args.name)


def _provision_certificate(
    settings: ServerSettings, admin: BrokerAdmin, name: str, csr_file: str | None
) -> None:
    csr = _request(csr_file) if csr_file else None
    key = _server_key(settings)
    engine = make_engine(settings.database_url)
    try:
        with session_factory(engine)() as session:
            issued = admin.provision_certificate(session, name, csr)  # commits its record
    except SQLAlchemyError as exc:
        raise ProvisioningError(
            "unavailable", f"cannot keep the certificate's record in the database: {exc}"
        ) from None
    finally:
        engine.dispose()
    listener = settings.broker.url if settings.broker else admin.broker.url
    print(
        f"provisioned device {name} with a certificate, for {listener}\n"
        f"login: {name} (the certificate's common name; no password)\n"
        f"serial: {issued.serial}, valid until {issued.not_after:%Y-%m-%d}\n"
        f"server key: {key}\n"
        "(give the device its certificate below as ZEAL_MQTT_CERT"
        + (
            " and its key as ZEAL_MQTT_KEY: the key is shown once and stored nowhere"
            if issued.private_key
            else ": its key is the one it made with its request"
        )
        + ", the broker's CA as ZEAL_MQTT_CA and the server key as ZEAL_SERVER_KEY)"
    )
    print(issued.certificate, end="")
    if issued.private_key:
        print(issued.private_key, end="")


def _revoke(settings: ServerSettings, admin: BrokerAdmin, name: str) -> None:
    if settings.device_ca is None:
        admin.revoke(name)  # passwords only: the broker is all there is
        print(f"revoked device {name}: disconnected, and its login is gone")
        return
    engine = make_engine(settings.database_url)
    try:
        with session_factory(engine)() as session:
            revoked = admin.revoke(name, session)
            session.commit()
    except SQLAlchemyError as exc:
        raise ProvisioningError(
            "unavailable", f"cannot read the record of certificates: {exc}"
        ) from None
    finally:
        engine.dispose()
    print(f"revoked device {name}: disconnected, and its login is gone")
    if revoked.certificates:
        print(
            f"certificates revoked: {revoked.certificates}; "
            + (
                "the broker refuses them already"
                if revoked.confirmed
                else "the broker refuses them once it has read the revocation list "
                "(ZEAL_DEVICE_CRL; not confirmed: is the broker's reload on change running?)"
            )
        )
