"""A test signer for ``serve --cert-command``: `python certsigner.py CA_PEM [RECORD_JSON]`.

It reads the public key (PEM) on stdin and signs it with the test CA in
CA_PEM (made beforehand by `make_ca`). What it prints depends on the last
segment of ``VOLFSM_SIGNER_NAME``:

* ``good``: a certificate living min(maxExpirationSeconds, 3600) s, then the CA's;
* ``short``: a certificate living `SHORT_TTL` s with ``beginRefreshAt`` half-way;
* ``garbage``: text that is no PEM;
* ``wrong-key``: a certificate for another key;
* ``expired``: a certificate that expired an hour ago;
* ``private-key``: a PRIVATE KEY block;
* ``fail``: a line on stderr and exit status 3.

With RECORD_JSON it writes the request there (the VOLFSM_* environment and stdin).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SHORT_TTL = 6
FAIL_LINE = "signer says no: request denied"
PEM = serialization.Encoding.PEM


def make_ca(path: Path) -> x509.Certificate:
    """A test CA (P-256 key and self-signed certificate) written to `path`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "volfsm test signer")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=3))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = key.private_bytes(
        PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ) + cert.public_bytes(PEM)
    path.write_bytes(pem)
    return cert


def _sign(ca_pem: bytes, public_key: object, start: datetime.datetime, seconds: int) -> bytes:
    ca_key = serialization.load_pem_private_key(ca_pem, password=None)
    ca_cert = x509.load_pem_x509_certificate(ca_pem)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    subject = f"{os.environ['VOLFSM_NAMESPACE']}/{os.environ['VOLFSM_POD_NAME']}"
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(seconds=seconds))
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(PEM) + ca_cert.public_bytes(PEM)


def main(argv: list[str]) -> int:
    """Answer one request (see the module doc)."""
    ca_pem = Path(argv[1]).read_bytes()
    stdin = sys.stdin.buffer.read()
    if len(argv) > 2:
        env = {k: v for k, v in os.environ.items() if k.startswith("VOLFSM_")}
        Path(argv[2]).write_text(json.dumps({"env": env, "stdin": stdin.decode()}))
    behaviour = os.environ["VOLFSM_SIGNER_NAME"].rsplit("/", 1)[-1]
    public_key = serialization.load_pem_public_key(stdin)
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    out = sys.stdout.buffer
    if behaviour == "fail":
        print(FAIL_LINE, file=sys.stderr)
        return 3
    if behaviour == "garbage":
        out.write(b"hello, not a certificate\n")
    elif behaviour == "private-key":
        other = ec.generate_private_key(ec.SECP256R1())
        fmt = serialization.PrivateFormat.PKCS8
        out.write(other.private_bytes(PEM, fmt, serialization.NoEncryption()))
    elif behaviour == "wrong-key":
        out.write(_sign(ca_pem, ec.generate_private_key(ec.SECP256R1()).public_key(), now, 600))
    elif behaviour == "expired":
        out.write(_sign(ca_pem, public_key, now - datetime.timedelta(hours=2), 3600))
    elif behaviour == "short":
        refresh = now + datetime.timedelta(seconds=SHORT_TTL // 2)
        out.write(f"beginRefreshAt: {refresh.isoformat()}\n".encode())
        out.write(_sign(ca_pem, public_key, now, SHORT_TTL))
    else:
        ttl = min(int(os.environ["VOLFSM_MAX_EXPIRATION_SECONDS"]), 3600)
        out.write(_sign(ca_pem, public_key, now, ttl))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
