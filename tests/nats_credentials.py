# SPDX-License-Identifier: Apache-2.0
"""NATS credentials made inside the tests, with the libraries from the registries: NKey pairs with
`nkeys`, operator / account / user JWTs with `nats-jwt` (operator mode, as `nsc` sets it up), and a
CA with server and client certificates with `cryptography`. Nothing is hand-encoded."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]
from nats_jwt.nkeys_ext import create_user_pair  # type: ignore[import-untyped]
from nats_jwt.v2.common import NoLimit  # type: ignore[import-untyped]
from nats_jwt.v2.operator_claims import OperatorClaims  # type: ignore[import-untyped]
from nats_jwt.v2.snippets import Account, Operator, User  # type: ignore[import-untyped]

# ------------------------------------------------------------------------------------------- NKeys


def user_seed() -> str:
    """A fresh user NKey seed (`SU...`)."""
    pair: Any = create_user_pair()
    return str(pair.seed.decode())


def public_key(seed: str) -> str:
    """The public key (`U...`, `A...`) of a seed."""
    return str(nkeys.from_seed(bytearray(seed.encode())).public_key.decode())


# -------------------------------------------------------------------------------------- operator mode


def creds_text(jwt: str, seed: str) -> str:
    """A creds file as `nsc generate creds` writes it."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


#: What a sidecar needs in an account minted here (see `OperatorSetup.create`).
STORAGE = {"SIE_STREAM_STORAGE": "file"}


@dataclass
class OperatorSetup:
    """An operator, a system account and one JetStream-enabled account for the workers, all minted
    with nats-jwt; `user()` mints users of that account."""

    operator: Any
    system: Any
    account: Any

    @classmethod
    def create(cls, name: str = "sie-test") -> OperatorSetup:
        operator = Operator()
        operator.claims = OperatorClaims(operator.key_pair.public_key.decode(), name)
        system = operator.create_account("SYS")
        account = operator.create_account("WORK")
        limits = account.claims.nats.limits
        # JetStream is on for an account only when its JWT gives it storage. nats-jwt 0.2.2 writes
        # the memory limit as `memory_storage`, where nats-server reads `mem_storage` (as nsc
        # writes it): the account gets disk storage only, so these tests run with
        # SIE_STREAM_STORAGE=file (`STORAGE`).
        limits.memory_storage = limits.disk_storage = limits.streams = limits.consumer = NoLimit
        operator.claims.nats.system_account = system.key_pair.public_key.decode()
        return cls(operator, system, account)

    def user(self, name: str, *, expires: int | None = None, account: Account | None = None) -> tuple[str, str]:
        """A user of the work account (or `account`): its JWT and its seed."""
        user: User = (account or self.account).create_user(name)
        if expires is not None:
            user.claims.exp = expires
        return str(user.jwt), str(user.key_pair.seed.decode())

    def write_creds(self, path: Path, name: str, **kw: Any) -> Path:
        jwt, seed = self.user(name, **kw)
        path.write_text(creds_text(jwt, seed))
        return path

    def server_config(self) -> str:
        """The nats-server settings of operator mode with a memory resolver (docs/deploying.md)."""
        accounts = (self.system, self.account)
        preload = "\n".join(f"  {a.key_pair.public_key.decode()}: {a.jwt}" for a in accounts)
        return (
            f"operator: {self.operator.jwt}\n"
            f"system_account: {self.system.key_pair.public_key.decode()}\n"
            "resolver: MEMORY\n"
            f"resolver_preload: {{\n{preload}\n}}\n"
        )


# ---------------------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_pki(directory: Path, name: str = "sie-sidecar test CA") -> Pki:
    """Write a CA, a server pair and a client pair (clientAuth) under `directory`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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

    def leaf(common_name: str, usage: Any, san: list[Any] | None) -> tuple[bytes, bytes]:
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
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        pem_key = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cert.public_bytes(serialization.Encoding.PEM), pem_key

    server = leaf(
        "127.0.0.1",
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
    )
    client = leaf("sie-worker", ExtendedKeyUsageOID.CLIENT_AUTH, None)
    pki = Pki(
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server-key.pem",
        directory / "client.pem",
        directory / "client-key.pem",
    )
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(server[0])
    pki.server_key.write_bytes(server[1])
    pki.client_cert.write_bytes(client[0])
    pki.client_key.write_bytes(client[1])
    return pki


def encrypt_key(source: Path, target: Path, passphrase: bytes) -> Path:
    """`source`'s private key, passphrase-protected, at `target`."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(source.read_bytes(), password=None)
    target.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(passphrase),
        )
    )
    return target


__all__ = ["STORAGE", "OperatorSetup", "Pki", "creds_text", "encrypt_key", "make_pki", "public_key", "user_seed"]
