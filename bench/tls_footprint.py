"""What TLS costs a microcontroller (docs/firmware.md, "TLS on a microcontroller"): mbed
TLS 2.28 (Debian's source package) with edge/firmware/examples/tls-footprint's
configuration and client, for the certificate suite the stack's broker offers and for a
pre-shared key.

- **Flash**: the client linked for a Cortex-M0 (the library's size example's target, the
  micro:bit's nRF51822; arm-none-eabi-gcc -Os, --gc-sections, newlib-nano), against the
  same start-up with an empty main: what a TLS session adds.
- **RAM**: the same client built for this host and run against real brokers, every
  allocation of mbed TLS counted: the heap's peak through the handshake, the MQTT CONNECT
  and the CONNACK. The deployment's broker config (deploy/mosquitto, its certificates
  from deploy/tls/make-certs): its password listener (8883, the CA only) and its
  certificate listener (8884, a device certificate of the device CA); and a private
  Mosquitto with a PSK listener. On a 64-bit host: a 32-bit device's pointers are half
  the size, its big numbers the same bytes, so its peak is at most this.

Needs the mbed TLS source: --mbedtls DIR, or it runs `apt-get source mbedtls` (a deb-src
line for Debian's archive) into a temporary folder. A benchmark, run by hand; it prints
its figures and writes them with --out.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.testbed.broker import BrokerTLS, Mosquitto, free_port
from tools.testbed.server import DeployBroker
from tools.testbed.verdict import finish

ROOT = Path(__file__).resolve().parents[1]


EXAMPLE = ROOT / "edge" / "firmware" / "examples" / "tls-footprint"
M0 = ROOT / "edge" / "firmware" / "examples" / "cortex-m0"
CONFIG = '-DMBEDTLS_CONFIG_FILE="zeal_tls_config.h"'
PSK = "5a65616c2d6b69746368656e2d312d70736b2d30303031"  # 23 bytes, the PSK device's key


def run(*command: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, command))[:300]}:\n{done.stderr[-3000:]}")
    return done.stdout


def mbedtls_source(given: Path | None, tmp: Path) -> Path:
    if given is not None:
        return given
    run("apt-get", "source", "-q", "mbedtls", cwd=tmp)
    return next(p for p in tmp.iterdir() if p.is_dir() and (p / "library" / "ssl_tls.c").exists())


def certificates(tmp: Path) -> tuple[BrokerTLS, dict[str, Path]]:
    """The stack's certificates (make-certs), a device's key and certificate signed by the
    device CA, all in DER too."""
    tls = BrokerTLS.make(tmp / "tls")
    d = tls.directory
    run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-out", d / "probe.key")  # fmt: skip
    run("openssl", "req", "-new", "-key", d / "probe.key", "-subj", "/CN=tls-probe",
        "-out", d / "probe.csr")  # fmt: skip
    (d / "probe.ext").write_text("extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n")
    run("openssl", "x509", "-req", "-sha256", "-in", d / "probe.csr", "-CA", d / "devices-ca.crt",
        "-CAkey", d / "devices-ca.key", "-set_serial", "7", "-days", "30",
        "-extfile", d / "probe.ext", "-out", d / "probe.crt")  # fmt: skip
    der = {
        "ca": d / "ca.der",
        "cert": d / "probe.der",
        "key": d / "probe.key.der",
    }
    run("openssl", "x509", "-in", d / "ca.crt", "-outform", "der", "-out", der["ca"])
    run("openssl", "x509", "-in", d / "probe.crt", "-outform", "der", "-out", der["cert"])
    run("openssl", "pkey", "-in", d / "probe.key", "-outform", "der", "-out", der["key"])
    return tls, der


def c_array(name: str, data: bytes) -> str:
    body = ",".join(str(b) for b in data)
    return f"static const unsigned char {name}[] = {{{body}}};\n"


def m0_sizes(source: Path, der: dict[str, Path], tmp: Path) -> dict[str, dict[str, int]]:
    """text, data and bss of the M0 client (certificate and PSK) and of the empty main."""
    header = tmp / "m0_login.h"
    header.write_text(
        c_array("ca_der", der["ca"].read_bytes())
        + c_array("cert_der", der["cert"].read_bytes())
        + c_array("key_der", der["key"].read_bytes())
        + c_array("psk", bytes.fromhex(PSK))
    )
    empty = tmp / "empty.c"
    empty.write_text("int main(void) { return 0; }\n")
    flags = ["-mcpu=cortex-m0", "-mthumb", "-Os", "-ffunction-sections", "-fdata-sections",
             f"-I{source / 'include'}", f"-I{EXAMPLE}", f"-I{M0}", f"-I{tmp}", CONFIG]  # fmt: skip
    link = ["-T", M0 / "link.ld", "--specs=nano.specs", "--specs=nosys.specs",
            "-Wl,--gc-sections", "-Wl,--defsym=end=_bss_end"]  # fmt: skip
    library = sorted((source / "library").glob("*.c"))
    sizes: dict[str, dict[str, int]] = {}
    for name, extra, mains in (
        ("empty", [], [empty]),
        ("certificate", [], [EXAMPLE / "client.c", EXAMPLE / "m0.c"]),
        ("psk", ["-DZEAL_TLS_PSK"], [EXAMPLE / "client.c", EXAMPLE / "m0.c"]),
    ):
        elf = tmp / f"m0-{name}.elf"
        run("arm-none-eabi-gcc", *flags, *extra, "-o", elf, M0 / "startup.c", *mains,
            *(library if name != "empty" else []), *link)  # fmt: skip
        said = run("arm-none-eabi-size", elf).splitlines()[1].split()
        sizes[name] = {"text": int(said[0]), "data": int(said[1]), "bss": int(said[2])}
    return sizes


def host_client(source: Path, tmp: Path, psk: bool) -> Path:
    binary = tmp / ("host-psk" if psk else "host-cert")
    run("gcc", "-O2", f"-I{source / 'include'}", f"-I{EXAMPLE}", CONFIG,
        *(["-DZEAL_TLS_PSK"] if psk else []), "-o", binary, EXAMPLE / "client.c",
        EXAMPLE / "host.c", *sorted((source / "library").glob("*.c")))  # fmt: skip
    return binary


def session(binary: Path, port: int, *args: str | Path) -> dict[str, object]:
    said = run(binary, "localhost", str(port), *args)
    found = re.match(
        r"connack (\d+) suite (\S+) peak_heap (\d+) allocations (\d+) left (\d+)", said
    )
    assert found, said
    return {
        "connack": int(found[1]),
        "suite": found[2],
        "peak_heap": int(found[3]),
        "allocations": int(found[4]),
        "left": int(found[5]),
    }


def psk_broker(tmp: Path) -> Mosquitto:
    broker = Mosquitto(tmp / "psk-broker")
    (tmp / "psk-broker" / "psk").write_text(f"kitchen-1:{PSK}\n")
    broker.config.write_text(
        broker.config.read_text().replace("allow_anonymous true\n", "")
        + f"psk_hint zeal\npsk_file {tmp / 'psk-broker' / 'psk'}\n"
        "use_identity_as_username true\nallow_anonymous false\n"
        "ciphers PSK-AES128-CCM8\n"
    )
    return broker


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mbedtls", type=Path, default=None, help="mbed TLS 2.28 source")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        source = mbedtls_source(args.mbedtls, tmp)
        version = re.search(r'MBEDTLS_VERSION_STRING\s+"([^"]+)"',
                            (source / "include/mbedtls/version.h").read_text())  # fmt: skip
        tls, der = certificates(tmp)
        sizes = m0_sizes(source, der, tmp)
        cert_client, psk_client = host_client(source, tmp, False), host_client(source, tmp, True)
        broker = DeployBroker(tmp / "broker", tls=tls).start()
        plain = psk_broker(tmp)
        plain.port = free_port()
        plain.config.write_text(re.sub(r"listener \d+", f"listener {plain.port}",
                                       plain.config.read_text()))  # fmt: skip
        plain.start()
        try:
            sessions = {
                "password listener (CA only)": session(
                    cert_client, tls.tls_port, "dev1", "--ca", der["ca"],
                    "--username", "dev1", "--password", "pw-dev1"),
                "certificate listener (device certificate)": session(
                    cert_client, tls.mtls_port, "tls-probe", "--ca", der["ca"],
                    "--cert", der["cert"], "--key", der["key"]),
                "PSK listener": session(
                    psk_client, plain.port, "kitchen-1", "--psk", PSK,
                    "--identity", "kitchen-1"),
            }  # fmt: skip
        finally:
            broker.stop()
            plain.stop()
    base = sizes["empty"]
    flash = {k: v["text"] + v["data"] - base["text"] - base["data"] for k, v in sizes.items()}
    static_ram = {k: v["data"] + v["bss"] - base["data"] - base["bss"] for k, v in sizes.items()}
    print(f"mbed TLS {version[1] if version else '?'}, {os.uname().machine} host, Cortex-M0:")
    for kind in ("certificate", "psk"):
        print(f"  flash, {kind} client: {flash[kind]:,} bytes "
              f"(static RAM {static_ram[kind]:,} bytes)")  # fmt: skip
    missed = []
    for name, figures in sessions.items():
        print(f"  {name}: CONNACK {figures['connack']}, {figures['suite']}, "
              f"heap peak {figures['peak_heap']:,} bytes "
              f"in {figures['allocations']} allocations")  # fmt: skip
        if figures["connack"] != 0 or figures["left"] != 0:
            missed.append(f"{name}: {figures}")
    results = {
        "mbedtls": version[1] if version else None,
        "m0": sizes,
        "flash": flash,
        "static_ram": static_ram,
        "sessions": sessions,
    }
    return finish(results, missed, args.out)


if __name__ == "__main__":
    sys.exit(main())
