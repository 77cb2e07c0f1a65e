# SPDX-License-Identifier: Apache-2.0
"""NATS credentials made inside the tests, with the libraries from the registries: NKey pairs with
`nkeys`, operator / account / user JWTs with `nats-jwt` (operator mode, as `nsc` sets it up), and a
CA with server and client certificates with `cryptography`. Nothing is hand-encoded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]
from nats_jwt.nkeys_ext import create_user_pair  # type: ignore[import-untyped]
from nats_jwt.v2.common import NoLimit  # type: ignore[import-untyped]
from nats_jwt.v2.operator_claims import OperatorClaims  # type: ignore[import-untyped]
from nats_jwt.v2.snippets import Account, Operator, User  # type: ignore[import-untyped]

from .integration.tls_certs import Pki, make_pki

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
