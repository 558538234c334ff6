"""``zeal-server devices ...``: device logins in the broker (zeal_server.broker.provisioning)
from the command line. Errors are ProvisioningError, printed in one line."""

from __future__ import annotations

import argparse

from sqlalchemy.exc import SQLAlchemyError

from zeal_server import store
from zeal_server.broker.provisioning import admin_for
from zeal_server.cli.common import Commands, command, fail
from zeal_server.errors import ProvisioningError, StoreError
from zeal_server.settings import ServerSettings
from zeal_server.store.db import make_engine, session_factory

__all__ = ["add_parsers", "run"]

BROKER = ("ZEAL_MQTT_URL", "ZEAL_MQTT_ADMIN_USERNAME", "ZEAL_MQTT_ADMIN_PASSWORD")


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
        "server's key the device is to check what the server signs with",
        variables=(*BROKER, "ZEAL_DATABASE_URL", "ZEAL_DATA_DIR"),  # the key: in the database
    )
    provision.add_argument("name", help="the device id (1-64 letters, digits, '_', '.' or '-')")
    revoke = command(
        sub,
        "revoke",
        "delete a device's broker login: a connected device is disconnected, and it can no "
        "longer connect (its stored data stays; DELETE .../devices/NAME removes it)",
        variables=BROKER,
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


def _carry_out(settings: ServerSettings, args: argparse.Namespace) -> None:
    admin = admin_for(settings)
    if args.action == "list":
        for name in admin.provisioned():
            print(name)
    elif args.action == "harden":
        changed = admin.harden()
        print(f"default access: deny; roles given the denials: {len(changed)}")
        for name in changed:
            print(f"  {name}")
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
        admin.revoke(args.name)
        print(f"revoked device {args.name}: disconnected, and its login is gone")
