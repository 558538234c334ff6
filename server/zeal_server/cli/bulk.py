"""``zeal-server devices provision --from FILE --out DIR``: the logins of a fleet from a
list (zeal_server.broker.provisioning.BrokerAdmin.provision_many).

The list holds one device a line, its id and optionally the path of its certificate
signing request; every entry is checked before any login is made. Each device's login is
written as it is made, into a folder of its own that is what goes onto the device
(``login.env``, ``device.crt``, ``device.key``), and a line of ``logins.csv`` without
secrets. A device whose folder exists is skipped: the same command run again after an
interruption makes the rest, and never a second login for a device already written."""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from zeal_server.broker.provisioning import BrokerAdmin
from zeal_server.errors import ProvisioningError
from zeal_server.logins import Outcome, Wanted
from zeal_server.settings import ServerSettings
from zeal_server.store.db import make_engine, session_factory

__all__ = ["provision_list", "read_list"]

#: Where the device's files go on a gateway (deploy/edge/zeal-edge.service).
ON_DEVICE = "/etc/zeal-edge"
COLUMNS = ("device", "login", "serial", "not_after", "result")
#: Progress is said every this many devices.
PROGRESS = 100


def read_list(path: str, certificate: bool) -> list[Wanted]:
    """The devices of a list file (``-``: standard input): per line an id and optionally
    the path of its signing request, relative to the list's folder (such a device gets a
    certificate, as every device does with `certificate`); blank lines and ``#`` comments
    skipped. ProvisioningError "invalid" naming the line of the first bad one."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProvisioningError("invalid", f"cannot read the list --from {path}: {exc}") from None
    folder = Path.cwd() if path == "-" else Path(path).parent
    wanted: list[Wanted] = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = [f for f in re.split(r"[\s,]+", line.split("#", 1)[0].strip()) if f]
        if not fields:
            continue
        if len(fields) > 2:
            raise ProvisioningError(
                "invalid",
                f"{path}, line {number}: a device id and at most the path of its signing "
                f"request, not {len(fields)} fields",
            )
        csr = None
        if len(fields) == 2:
            try:
                csr = (folder / fields[1]).read_bytes()
            except OSError as exc:
                raise ProvisioningError(
                    "invalid", f"{path}, line {number}: cannot read its request: {exc}"
                ) from None
        wanted.append(Wanted(fields[0], certificate=certificate or csr is not None, csr=csr))
    if not wanted:
        raise ProvisioningError("invalid", f"no device in the list {path}")
    return wanted


def provision_list(
    settings: ServerSettings,
    admin: BrokerAdmin,
    args: argparse.Namespace,
    server_key: Callable[[ServerSettings], str],
) -> None:
    """Carry out ``devices provision --from FILE --out DIR``, printing progress on standard
    error and a summary; ProvisioningError when an entry was not provisioned."""
    if args.listed is None or args.out is None:
        raise ProvisioningError("invalid", "a list needs both --from FILE and --out DIR")
    if args.name is not None or args.csr is not None:
        raise ProvisioningError(
            "invalid",
            "--from provisions the devices of its list: no NAME, and no --csr (a list names "
            "each device's request beside it)",
        )
    wanted = read_list(args.listed, args.certificate)
    out = Path(args.out)
    try:
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ProvisioningError("invalid", f"cannot make --out {out}: {exc}") from None
    todo = [w for w in wanted if not (out / w.device).exists()]
    if len(todo) < len(wanted):
        print(f"skipped {len(wanted) - len(todo)} device(s) whose folder is in {out} already")
    if not todo:
        print("nothing to provision")
        return
    key = server_key(settings)  # before any login is made: a failure makes none
    made: list[Outcome] = []
    refused: list[Outcome] = []
    with _session(settings, any(w.certificate for w in todo)) as session:
        for outcome in admin.provision_many(todo, session):
            (refused if outcome.refused else made).append(outcome)
            if outcome.refused is None:
                _write_device(out, outcome, key)
            _write_row(out, outcome)
            done = len(made) + len(refused)
            if done % PROGRESS == 0 and done < len(todo):
                print(f"  {done} of {len(todo)}...", file=sys.stderr, flush=True)
    certificates = sum(1 for o in made if o.issued is not None)
    print(
        f"provisioned {len(made)} device(s) into {out}: {len(made) - certificates} with a "
        f"password, {certificates} with a certificate\n"
        f"(copy {out}/NAME/* to each device's {ON_DEVICE}/ and delete them here: the "
        "passwords and keys are in these files only)"
    )
    if refused:
        shown = "; ".join(f"{o.device}: {o.refused}" for o in refused[:5])
        more = f" (and {len(refused) - 5} more, in logins.csv)" if len(refused) > 5 else ""
        raise ProvisioningError(
            "exists"
            if all(o.refused and o.refused.kind == "exists" for o in refused)
            else "unavailable",
            f"{len(refused)} of {len(todo)} not provisioned: {shown}{more}",
        )


@contextlib.contextmanager
def _session(settings: ServerSettings, needed: bool) -> Iterator[Session | None]:
    """The database session certificates are recorded in (None when none is made)."""
    if not needed:
        yield None
        return
    engine = make_engine(settings.database_url)
    try:
        with session_factory(engine)() as session:
            yield session
    except SQLAlchemyError as exc:
        raise ProvisioningError(
            "unavailable", f"cannot keep the certificates' records in the database: {exc}"
        ) from None
    finally:
        engine.dispose()


def _private(path: Path, text: str) -> None:
    """Write a new file only its owner can read (never over an existing one)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)


def _write_device(out: Path, outcome: Outcome, key: str) -> None:
    """The device's folder: what goes onto it."""
    folder = out / outcome.device
    folder.mkdir(mode=0o700)
    lines = [
        f"# The login of device {outcome.device} (zeal-server devices provision, "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d}). Copy this folder's files to the device's",
        f"# {ON_DEVICE}/ (deploy/edge/zeal-edge.service reads login.env after zeal-edge.env).",
        f"ZEAL_DEVICE={outcome.device}",
    ]
    if outcome.issued is None:
        lines += [
            "# The broker's password listener (e.g. mqtts://HOST:8883) is ZEAL_MQTT_URL.",
            f"ZEAL_MQTT_USERNAME={outcome.device}",
            f"ZEAL_MQTT_PASSWORD={outcome.password}",
        ]
    else:
        issued = outcome.issued
        lines += [
            f"# Certificate {issued.serial}, valid until {issued.not_after:%Y-%m-%d}; the broker's",
            "# certificate listener (e.g. mqtts://HOST:8884) is ZEAL_MQTT_URL.",
            f"ZEAL_MQTT_CERT={ON_DEVICE}/device.crt",
            *(() if issued.private_key else ("# device.key: the key it made its request with",)),
            f"ZEAL_MQTT_KEY={ON_DEVICE}/device.key",
        ]
        _private(folder / "device.crt", issued.certificate)
        if issued.private_key:
            _private(folder / "device.key", issued.private_key)
    lines.append(f"ZEAL_SERVER_KEY={key}")
    _private(folder / "login.env", "\n".join(lines) + "\n")


def _write_row(out: Path, outcome: Outcome) -> None:
    """One line of DIR/logins.csv (no secret: the login, the certificate, the result)."""
    path = out / "logins.csv"
    new = not path.exists()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(descriptor, "a", newline="") as file:
        writer = csv.writer(file)
        if new:
            writer.writerow(COLUMNS)
        issued = outcome.issued
        writer.writerow(
            (
                outcome.device,
                "" if outcome.refused else ("certificate" if issued else "password"),
                issued.serial if issued and not outcome.refused else "",
                f"{issued.not_after:%Y-%m-%d}" if issued and not outcome.refused else "",
                f"refused: {outcome.refused}" if outcome.refused else "provisioned",
            )
        )
