"""Provisioning a fleet: one device at a time against a list (docs/operations.md, "A fleet
from a list").

The deployment's broker configuration (deploy/mosquitto, its TLS listeners with the
certificates deploy/tls/make-certs makes) on a private Mosquitto; the admin logs in over
TLS as the server's does. N devices are provisioned, each time on a fresh broker: one at
a time (`BrokerAdmin.provision`, what `devices provision NAME` or POST
/devices/NAME/login does each), from a list (`provision_many`) with passwords, and from a
list with certificates made on the server (their records in a SQLite database). Figures:
devices a second, and the list's speed-up measured in the same run. Target: the list at
least 5x faster for passwords (a TLS connection per device against one per some 35).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tools.testbed.broker import BrokerTLS
from tools.testbed.server import DeployBroker
from tools.testbed.verdict import finish
from zeal.mqtt.brokerurl import parse_broker_url
from zeal_server.broker.provisioning import BrokerAdmin
from zeal_server.logins import Wanted
from zeal_server.settings import DeviceCASettings
from zeal_server.store.db import make_engine, migrate, session_factory

ROOT = Path(__file__).resolve().parents[1]


TARGET = 5.0


def per_second(n: int, mode: str) -> float:
    """Devices a second provisioning `n` devices on a fresh broker: `mode` "one" (one at a
    time), "password" or "certificate" (from a list)."""
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        tls = BrokerTLS.make(tmp / "tls")
        broker = DeployBroker(tmp / "broker", tls=tls).start()
        engine = make_engine(f"sqlite:///{tmp / 'zeal.sqlite'}")
        migrate(engine)
        try:
            admin = BrokerAdmin(
                parse_broker_url(
                    f"mqtts://localhost:{tls.tls_port}", ca_file=str(tls.directory / "ca.crt")
                ),
                "zeal-admin",
                "pw-zeal-admin",
                device_ca=DeviceCASettings(
                    tls.directory / "devices-ca.crt",
                    tls.directory / "devices-ca.key",
                    tls.directory / "crl" / "devices.crl",
                ),
            )
            started = time.perf_counter()
            if mode == "one":
                for i in range(n):
                    admin.provision(f"device-{i:05d}")
            else:
                wanted = [Wanted(f"device-{i:05d}", mode == "certificate") for i in range(n)]
                with session_factory(engine)() as session:
                    outcomes = list(admin.provision_many(wanted, session))
                assert all(o.refused is None for o in outcomes), outcomes[0]
            took = time.perf_counter() - started
            assert len(admin.provisioned()) == n
        finally:
            broker.stop()
            engine.dispose()
    return n / took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    n = args.devices
    figures = {mode: per_second(n, mode) for mode in ("one", "password", "certificate")}
    ratio = figures["password"] / figures["one"]
    print(f"{n} devices each way, each on a fresh broker of the deployment's config, over TLS:")
    print(f"  one at a time:                       {figures['one']:7.1f} devices/s")
    print(f"  from a list, passwords:              {figures['password']:7.1f} devices/s "
          f"({ratio:.1f}x; target >= {TARGET:g}x)")  # fmt: skip
    print(
        f"  from a list, certificates made here: {figures['certificate']:7.1f} devices/s "
        "(a key and a signature each, records committed)"
    )
    missed = [] if ratio >= TARGET else [f"list speed-up {ratio:.1f}x < {TARGET:g}x"]
    return finish({**figures, "devices": n, "ratio": ratio}, missed, args.out)


if __name__ == "__main__":
    sys.exit(main())
