# SPDX-License-Identifier: Apache-2.0
"""What both IPC transports (pooled and multiplexed) share: socket read sizes and the §1.2 rule of
which transport failures get the one retry."""

from __future__ import annotations

import asyncio
import errno
from typing import Final

from ..errors import TransportFailure

# StreamReader buffer limit and read size: large enough that a 32 MiB frame or a 128 MiB chunked
# transfer is read in few wake-ups, small enough to keep backpressure on the socket.
READ_LIMIT: Final = 1 << 20
READ_SIZE: Final = 4 << 20

# errno values of the transport failures that get the one retry (wire-protocol §1.2): broken pipe,
# reset, aborted, not connected, would-block, not found, refused.
RETRY_ERRNOS: Final = frozenset(
    {
        errno.EPIPE,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ENOTCONN,
        errno.EAGAIN,
        errno.EWOULDBLOCK,
        errno.ENOENT,
        errno.ECONNREFUSED,
    }
)


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, EOFError | asyncio.IncompleteReadError | ConnectionError | FileNotFoundError):
        return True
    return isinstance(exc, OSError) and exc.errno in RETRY_ERRNOS


__all__ = ["READ_LIMIT", "READ_SIZE", "RETRY_ERRNOS", "TransportFailure", "is_retryable"]
