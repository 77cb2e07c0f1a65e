# SPDX-License-Identifier: Apache-2.0
"""S3 payload reader (sidecar-behaviour §12) through obstore (`obstore_reader`).

obstore reads credentials, region and endpoint from the standard AWS environment (static keys,
session token, web identity / IRSA, ECS and EC2 instance metadata; `AWS_ENDPOINT_URL` for
S3-compatible servers). It was chosen over aiobotocore because the same package speaks GCS too.
"""

from __future__ import annotations

import os
import re

from obstore.store import S3Store

from .errors import PayloadStoreConfigError
from .object_keys import ObjectRoot, validate_key
from .object_keys import parse_store_url as _parse_store_url
from .obstore_reader import RETRY, ObstoreReader
from .obstore_reader import client_options as _client_options

SCHEME = "s3://"
_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}", re.ASCII)
ALLOW_HTTP_VAR = "AWS_ALLOW_HTTP"


def parse_store_url(url: str) -> tuple[str, str]:
    """`s3://bucket[/prefix]` → (bucket, prefix without surrounding slashes); config error otherwise."""
    return _parse_store_url(url, SCHEME, _BUCKET_RE)


class S3Reader(ObstoreReader):
    """Reads keys under `s3://bucket/prefix/`, bounded by size from metadata and while streaming."""

    def __init__(self, url: str) -> None:
        bucket, prefix = parse_store_url(url)
        options = _client_options(os.environ, ALLOW_HTTP_VAR)
        try:
            store = S3Store(bucket, client_options=options, retry_config=RETRY)
        except Exception as exc:  # obstore reports bad environment configuration at construction
            raise PayloadStoreConfigError(f"cannot configure the S3 payload store: {exc}") from None
        super().__init__(ObjectRoot(SCHEME, bucket, prefix), store)


__all__ = ["SCHEME", "S3Reader", "parse_store_url", "validate_key"]
