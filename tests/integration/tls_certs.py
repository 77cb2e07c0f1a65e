# SPDX-License-Identifier: Apache-2.0
"""A throw-away CA and a server certificate for 127.0.0.1 / localhost, made inside the test: with the
`cryptography` package when it is installed (moto brings it), else with the `openssl` command."""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def make_certs(directory: Path) -> TlsFiles:
    """Write ca.pem, server.pem and server-key.pem under `directory`."""
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl command is available")
        _with_openssl(files)
    else:
        _with_cryptography(files)
    return files


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for 127.0.0.1 / localhost and a client certificate (clientAuth),
    as PEM files: for the mutual-TLS tests (NATS logins, OTLP receivers)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_pki(directory: Path, name: str = "sie-sidecar test CA", client_cn: str = "sie-worker") -> Pki:
    """Write the CA, the server pair and the client pair under `directory` with `cryptography`, with
    the extensions OpenSSL's strict verification wants (key usage on the CA, subject and authority
    key identifiers)."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        pytest.skip("the cryptography package is not installed")

    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(common_name: str, usage: x509.ObjectIdentifier, server: bool) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        )
        if server:
            san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        pem_key = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cert.public_bytes(serialization.Encoding.PEM), pem_key

    pki = Pki(*(directory / n for n in ("ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem")))
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for (cert_path, key_path), (cert, key) in (
        ((pki.server_cert, pki.server_key), leaf("127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH, server=True)),
        ((pki.client_cert, pki.client_key), leaf(client_cn, ExtendedKeyUsageOID.CLIENT_AUTH, server=False)),
    ):
        cert_path.write_bytes(cert)
        key_path.write_bytes(key)
    return pki


def _with_cryptography(files: TlsFiles) -> None:
    pki = make_pki(files.ca.parent)  # writes ca.pem, server.pem, server-key.pem: the TlsFiles names
    assert (pki.ca, pki.server_cert, pki.server_key) == (files.ca, files.cert, files.key)


def _with_openssl(files: TlsFiles) -> None:
    directory = files.ca.parent
    ca_key, csr, ext = directory / "ca-key.pem", directory / "server.csr", directory / "server.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(ca_key), "-out", str(files.ca), "-days", "1", "-subj", "/CN=sie-sidecar test CA",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(files.key), "-out", str(csr), "-subj", "/CN=127.0.0.1",
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(files.ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(files.cert), "-days", "1", "-extfile", str(ext),
    )  # fmt: skip


__all__ = ["Pki", "TlsFiles", "make_certs", "make_pki"]
