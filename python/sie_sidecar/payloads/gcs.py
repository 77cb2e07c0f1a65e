# SPDX-License-Identifier: Apache-2.0
"""GCS payload reader (sidecar-behaviour §12) through obstore's `GCSStore` (`obstore_reader`).

Credentials come from the standard Google environment as the Rust `object_store` crate reads it:
`GOOGLE_SERVICE_ACCOUNT` / `GOOGLE_SERVICE_ACCOUNT_PATH` (a service-account JSON file),
`GOOGLE_SERVICE_ACCOUNT_KEY` (its contents), `GOOGLE_APPLICATION_CREDENTIALS` (application default
credentials), otherwise the GCE / GKE metadata server (workload identity). An emulator is reached
through a service-account file with `"gcs_base_url"` and `"disable_oauth": true`, plus
`GOOGLE_ALLOW_HTTP=true` when it speaks plain HTTP.
"""

from __future__ import annotations

import os
import re

from obstore.store import GCSStore

from .errors import PayloadStoreConfigError
from .object_keys import ObjectRoot
from .object_keys import parse_store_url as _parse_store_url
from .obstore_reader import RETRY, ObstoreReader, client_options

SCHEME = "gs://"
#: Google's bucket naming rules: 3-222 characters of `[a-z0-9._-]`, a letter or digit at both ends.
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]", re.ASCII)
ALLOW_HTTP_VAR = "GOOGLE_ALLOW_HTTP"


def parse_store_url(url: str) -> tuple[str, str]:
    """`gs://bucket[/prefix]` → (bucket, prefix without surrounding slashes); config error otherwise."""
    return _parse_store_url(url, SCHEME, _BUCKET_RE)


class GCSReader(ObstoreReader):
    """Reads keys under `gs://bucket/prefix/`, bounded by size from metadata and while streaming."""

    def __init__(self, url: str) -> None:
        bucket, prefix = parse_store_url(url)
        options = client_options(os.environ, ALLOW_HTTP_VAR)
        try:
            store = GCSStore(bucket, client_options=options, retry_config=RETRY)
        except Exception as exc:  # a malformed credentials file is reported at construction
            raise PayloadStoreConfigError(f"cannot configure the GCS payload store: {exc}") from None
        super().__init__(ObjectRoot(SCHEME, bucket, prefix), store)


__all__ = ["SCHEME", "GCSReader", "parse_store_url"]
