# SPDX-License-Identifier: Apache-2.0
"""Azure Blob payload reader (sidecar-behaviour §12: `abfs://` / `abfss://`
`container@account(.dfs|.blob).core.windows.net[/prefix]`) through obstore's `AzureStore`
(`obstore_reader`): the same size limits, errors and key rules as the S3 and GCS stores.

Credentials come from the standard Azure environment as the Rust `object_store` crate reads it:
- SharedKey: `AZURE_STORAGE_ACCOUNT_KEY` (or `AZURE_STORAGE_ACCESS_KEY`);
- a SAS: `AZURE_STORAGE_SAS_KEY` (or `AZURE_STORAGE_SAS_TOKEN`);
- workload identity (AKS): `AZURE_FEDERATED_TOKEN_FILE` with `AZURE_CLIENT_ID` and `AZURE_TENANT_ID`;
- a service principal: `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET`, `AZURE_TENANT_ID`;
- otherwise the instance's managed identity.
`AZURE_STORAGE_ENDPOINT` points at another endpoint (an emulator, a sovereign cloud's host), and
`AZURE_ALLOW_HTTP=true` lets it be plain HTTP.
"""

from __future__ import annotations

import os
import re
from typing import Final

from obstore.store import AzureStore

from .errors import PayloadStoreConfigError
from .object_keys import ObjectRoot
from .obstore_reader import RETRY, ObstoreReader, client_options

SCHEMES: Final = ("abfs://", "abfss://")
ALLOW_HTTP_VAR: Final = "AZURE_ALLOW_HTTP"
#: `container@account.(dfs|blob).core.windows.net`: Azure's container (3-63 of `[a-z0-9-]`, a letter
#: or digit at both ends, no `--`) and storage-account (3-24 of `[a-z0-9]`) naming rules.
_AUTHORITY_RE: Final = re.compile(
    r"(?P<container>[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62})"
    r"@(?P<account>[a-z0-9]{3,24})\.(?:dfs|blob)\.core\.windows\.net",
    re.ASCII,
)


def parse_store_url(url: str) -> tuple[str, str, str, str]:
    """`abfs[s]://container@account.(dfs|blob).core.windows.net[/prefix]` → (scheme, authority,
    container, account) with the prefix checked; a config error naming the rule otherwise."""
    scheme = next((s for s in SCHEMES if url.startswith(s)), None)
    if scheme is None:
        raise PayloadStoreConfigError("an Azure payload store URL must start with abfs:// or abfss://")
    authority = url[len(scheme) :].partition("/")[0]
    m = _AUTHORITY_RE.fullmatch(authority)
    if m is None:
        raise PayloadStoreConfigError(
            "an Azure payload store URL must name container@account.dfs.core.windows.net "
            "(or .blob.core.windows.net) with valid container and account names"
        )
    return scheme, authority, m["container"], m["account"]


def object_root(url: str) -> ObjectRoot:
    """The store's root: keys under its prefix; a full-URL ref must repeat the whole authority."""
    from .object_keys import parse_store_url as _parse

    scheme, authority, _, _ = parse_store_url(url)
    _, prefix = _parse(url, scheme, re.compile(re.escape(authority)))
    return ObjectRoot(scheme, authority, prefix)


class AzureReader(ObstoreReader):
    """Reads keys under `abfs[s]://container@account.../prefix/`, bounded by size from metadata and
    while streaming."""

    def __init__(self, url: str) -> None:
        _, _, container, account = parse_store_url(url)
        root = object_root(url)
        options = client_options(os.environ, ALLOW_HTTP_VAR)
        try:
            store = AzureStore(container, account_name=account, client_options=options, retry_config=RETRY)
        except Exception as exc:  # obstore reports bad environment configuration at construction
            raise PayloadStoreConfigError(f"cannot configure the Azure payload store: {exc}") from None
        super().__init__(root, store)


__all__ = ["ALLOW_HTTP_VAR", "SCHEMES", "AzureReader", "object_root", "parse_store_url"]
