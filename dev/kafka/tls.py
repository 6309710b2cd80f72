"""Certificates for a secured local broker: a CA of its own, the broker's certificate and client
certificates, as PEM files (what Kafka's PEM key stores, librdkafka and Python's `ssl` all read).

Generated with the `openssl` command line (standard library only: `make kafka` runs before any
virtualenv exists), once per state directory, so that clients keep trusting the CA across
restarts of the broker.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

DAYS = 825  # the longest validity that clients (macOS, browsers) accept for a leaf certificate
BROKER_NAME = "broker"
"""The broker's certificate CN; its principal on an SSL listener is User:broker."""


class TlsError(Exception):
    """openssl missing or failing; one line for the user."""


@dataclass(frozen=True)
class Pair:
    """A certificate and its unencrypted PKCS#8 private key, and both in one file (a PEM
    key store as Kafka reads it)."""

    cert: Path
    key: Path
    keystore: Path


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise TlsError(
            "`openssl` not found on PATH: install it (Debian: apt-get install openssl) "
            "to start a broker with --security ssl or sasl_ssl"
        )
    result = subprocess.run([openssl, *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise TlsError(f"openssl {args[0]} failed: {detail[-1] if detail else '?'}")


def ca(directory: Path) -> Pair:
    """The CA in `directory`, created if absent."""
    pair = Pair(directory / "ca.pem", directory / "ca.key", directory / "ca.keystore.pem")
    if pair.cert.exists() and pair.key.exists():
        return pair
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        str(pair.key),
        "-out",
        str(pair.cert),
        "-days",
        str(DAYS),
        "-subj",
        f"/CN=storage-events local CA {directory.parent.name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    pair.key.chmod(0o600)
    return pair


def issue(directory: Path, name: str, authority: Pair) -> Pair:
    """A certificate with CN=`name` signed by `authority`, valid for 127.0.0.1 and localhost
    (hostname verification stays on) as a server and as a client; created if absent."""
    pair = Pair(
        directory / f"{name}.pem", directory / f"{name}.key", directory / f"{name}.keystore.pem"
    )
    if pair.cert.exists() and pair.key.exists() and pair.keystore.exists():
        return pair
    with tempfile.TemporaryDirectory() as scratch:
        csr = Path(scratch) / "request.csr"
        extensions = Path(scratch) / "extensions.cnf"
        extensions.write_text(
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
        )
        _openssl(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            str(pair.key),
            "-out",
            str(csr),
            "-subj",
            f"/CN={name}",
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(authority.cert),
            "-CAkey",
            str(authority.key),
            "-CAcreateserial",
            "-CAserial",
            str(Path(scratch) / "ca.srl"),
            "-out",
            str(pair.cert),
            "-days",
            str(DAYS),
            "-extfile",
            str(extensions),
        )
    pair.key.chmod(0o600)
    pair.keystore.write_text(
        pair.key.read_text() + pair.cert.read_text() + authority.cert.read_text()
    )
    pair.keystore.chmod(0o600)
    return pair
