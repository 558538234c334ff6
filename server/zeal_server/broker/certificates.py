"""Device certificates: issued from a request made on the device, revoked through the list
the broker reads.

A device provisioned with a certificate (``zeal-server devices provision NAME
--certificate``) logs in to the broker's certificate listener, which takes the
certificate's common name as the login (Mosquitto's ``use_identity_as_username``) and the
login as the client id (``use_username_as_clientid``), so its topic rights are exactly
those of a password login of the same name (the dynamic security role of
:mod:`zeal_server.broker.provisioning`) and nobody else can land on its session. Best, the
device makes its own key and sends a certificate signing request (``--csr FILE``): its
private key never leaves it. Without a request a key is made here and handed over once,
like a password; it is kept nowhere.

The certificate is signed by the *device CA* (ZEAL_DEVICE_CA, ZEAL_DEVICE_CA_KEY), which
signs nothing but client certificates: the CA the devices check the broker's certificate
with is another one, whose key is not on the server. Its subject is ``CN=NAME`` whatever
the request asked (a request naming another common name is refused), with the client-auth
extended key usage only.

Revoking a device writes a new revocation list (ZEAL_DEVICE_CRL) naming every certificate
ever revoked (the ``device_certificates`` table is the record), signed by the device CA.
Mosquitto reads its ``crlfile`` again only when told to reload (SIGHUP;
deploy/mosquitto/reload-on-change does so when the file changes), and a reload does not
drop a connected client. So :func:`revoke` also revokes a throwaway *probe* certificate in
the same list, one the broker accepted just before, and connects with it until the broker
refuses it: from then on the broker refuses the device's certificate too, and only then is
the device's connection dropped (provisioning.BrokerAdmin.revoke). OpenSSL picks, among the
lists of one CA it has loaded, the one issued last, so every list is issued at least a
second after the one before.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
import ssl
import struct
import tempfile
import time
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from sqlalchemy.orm import Session

from zeal.mqtt.brokerurl import BrokerSettings
from zeal_server import store
from zeal_server.errors import ProvisioningError
from zeal_server.settings import DeviceCASettings

__all__ = ["PROBE_NAME", "DeviceCA", "broker_answer"]

#: The common name of the probe certificates (a reserved name: no device can have it).
PROBE_NAME = "zeal-revocation-probe"
#: How long revoking waits for the broker to load the new list before it says so.
RELOAD_WAIT = 60.0
#: The least RSA key a device may present.
MIN_RSA_BITS = 2048


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _ms(when: dt.datetime) -> int:
    return int(when.timestamp() * 1000)


class DeviceCA:
    """The CA of device certificates, from its files (ProvisioningError "off" when they
    cannot be read)."""

    def __init__(self, settings: DeviceCASettings) -> None:
        self.settings = settings
        try:
            self.cert = x509.load_pem_x509_certificate(settings.cert.read_bytes())
            key = serialization.load_pem_private_key(settings.key.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise ProvisioningError(
                "off",
                f"cannot read the device CA (ZEAL_DEVICE_CA {settings.cert}, ZEAL_DEVICE_CA_KEY "
                f"{settings.key}): {exc}",
            ) from None
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise ProvisioningError("off", "the device CA's key must be an EC or RSA key")
        self.key = key

    def issue(self, device: str, csr_pem: bytes | None = None) -> store.Issued:
        """A client certificate for `device`: for the key of `csr_pem` (a PEM certificate
        signing request, its signature checked), or for a P-256 key made here."""
        private_pem: str | None = None
        public: ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey
        if csr_pem is None:
            made = ec.generate_private_key(ec.SECP256R1())
            public = made.public_key()
            private_pem = made.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ).decode()
        else:
            public = _requested_key(device, csr_pem)
        now = _now()
        not_after = now + dt.timedelta(days=self.settings.days)
        serial = x509.random_serial_number()
        ca_public = self.cert.public_key()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device)]))
            .issuer_name(self.cert.subject)
            .public_key(public)
            .serial_number(serial)
            .not_valid_before(now - dt.timedelta(minutes=5))  # a device clock a little behind
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=isinstance(public, rsa.RSAPublicKey),
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public),  # type: ignore[arg-type]
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        return store.Issued(
            device=device,
            certificate=certificate.public_bytes(serialization.Encoding.PEM).decode(),
            serial=format(serial, "x"),
            not_after=not_after,
            private_key=private_pem,
        )

    def write_list(self, session: Session, *, probe: int | None = None) -> None:
        """Write the revocation list: every revoked certificate of the record (and the
        probe's serial), issued at least a second after the list in the file."""
        now = _now()
        with contextlib.suppress(OSError, ValueError):
            last = x509.load_pem_x509_crl(self.settings.crl.read_bytes()).last_update_utc
            while now <= last:  # OpenSSL prefers the list issued last: never the same second
                time.sleep(0.2)
                now = _now()
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self.cert.subject)
            .last_update(now)
            .next_update(now + dt.timedelta(days=36_500))  # a lapsed list refuses every device
        )
        entries = [
            (serial, dt.datetime.fromtimestamp(ms / 1000, dt.UTC))
            for serial, ms in store.revoked_certificates(session)
        ]
        if probe is not None:
            entries.append((probe, now))
        for serial, when in entries:
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build()
            )
        pem = builder.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        target = self.settings.crl
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".crl-", delete=False) as out:
            out.write(pem)
        Path(out.name).chmod(0o644)
        Path(out.name).replace(target)  # the broker never reads half a list

    def revoke(
        self, session: Session, device: str, broker: BrokerSettings | None
    ) -> tuple[int, bool]:
        """Mark every valid certificate of `device` revoked (committed first: the list is
        written from the record, so a list never holds less than the record), write the
        list and wait until the broker refuses a probe certificate revoked in it (when
        `broker` is its certificate listener). Returns (certificates revoked, the broker
        confirmed)."""
        count = store.revoke_certificates(session, device, _ms(_now()))
        session.commit()
        if not count:
            return 0, False
        if broker is None or not broker.tls or not broker.cert_file:
            self.write_list(session)
            return count, False
        # A probe the broker accepts before the list and refuses after it: the list (and
        # nothing else, a broker down or a CA it does not trust) made the difference.
        probe = self.issue(PROBE_NAME)
        before = broker_answer(broker, probe)
        self.write_list(session, probe=int(probe.serial, 16))
        if before != "accepted":
            return count, False
        deadline = time.monotonic() + RELOAD_WAIT
        while time.monotonic() < deadline:
            if broker_answer(broker, probe) == "refused":
                return count, True
            time.sleep(0.5)
        return count, False


def _requested_key(
    device: str, csr_pem: bytes
) -> ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey:
    """The public key of a device's certificate signing request, checked."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError:
        raise ProvisioningError(
            "invalid", "the certificate signing request is not a PEM request (openssl req -new)"
        ) from None
    try:
        valid = csr.is_signature_valid
    except (InvalidSignature, ValueError):
        valid = False
    if not valid:
        raise ProvisioningError("invalid", "the certificate signing request's signature is wrong")
    names = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if names and names != [device]:
        raise ProvisioningError(
            "invalid",
            f"the certificate signing request names {names[0]!r}, not the device {device!r} "
            "(make it with -subj /CN=" + device + ")",
        )
    public = csr.public_key()
    if isinstance(public, rsa.RSAPublicKey) and public.key_size < MIN_RSA_BITS:
        raise ProvisioningError("invalid", f"an RSA key must have at least {MIN_RSA_BITS} bits")
    if isinstance(public, ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey):
        return public
    kind = "Ed448" if isinstance(public, ed448.Ed448PublicKey) else type(public).__name__
    raise ProvisioningError("invalid", f"a device key must be EC, RSA or Ed25519, not {kind}")


def broker_answer(broker: BrokerSettings, issued: store.Issued, timeout: float = 5.0) -> str:
    """What the broker's certificate listener answers `issued` (made here, with its key): a
    TLS connection and an MQTT 3.1.1 CONNECT. "accepted" (a CONNACK that accepts it),
    "refused" (the connection closed, or refused, before: under TLS 1.3 a refused client
    certificate shows only after the handshake), or "unreachable" (no TCP connection)."""
    assert issued.private_key is not None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=broker.ca_file)
    with tempfile.TemporaryDirectory() as folder:
        cert, key = Path(folder, "probe.crt"), Path(folder, "probe.key")
        cert.write_text(issued.certificate)
        key.write_text(issued.private_key)
        context.load_cert_chain(cert, key)
    client_id = PROBE_NAME.encode()
    body = b"\x00\x04MQTT\x04\x02\x00\x0a" + struct.pack(">H", len(client_id)) + client_id
    try:
        raw = socket.create_connection((broker.host, broker.port), timeout=timeout)
    except OSError:
        return "unreachable"
    try:
        with raw, context.wrap_socket(raw, server_hostname=broker.host) as tls:
            tls.sendall(bytes([0x10, len(body)]) + body)
            answer = tls.recv(4)
            with contextlib.suppress(OSError):
                tls.sendall(b"\xe0\x00")  # DISCONNECT
    except OSError:  # ssl.SSLError among them: the certificate refused
        return "refused"
    accepted = len(answer) == 4 and answer[0] == 0x20 and answer[3] == 0
    return "accepted" if accepted else "refused"
