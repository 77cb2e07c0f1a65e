# SPDX-License-Identifier: Apache-2.0
"""The NATS permissions a worker's user needs, and nothing more (sidecar-behaviour §2.6, newer than
v0.7.1). docs/deploying.md prints them as a nats-server `authorization` block, and
`tests/integration/test_nats_permissions.py` runs the sidecar under exactly these on a real
nats-server: it serves, and the server logs no permissions violation.

What the list leaves out is the point: a worker cannot read the gateways' `_INBOX.>` (its own replies
come to `_INBOX_WORKER.>`), publish work, config or cancels, or delete or purge streams.
"""

from __future__ import annotations

from typing import Final

#: What the worker subscribes to: its own reply inboxes, live config notifications, the three
#: cancel trees.
WORKER_SUBSCRIBE: Final = (
    "_INBOX_WORKER.>",
    "sie.config.models.*",
    "work_cancel.>",
    "batch_cancel.>",
    "cancel.>",
)

#: What the worker publishes: results to the gateways' inboxes, its health, JetStream ACKs, and the
#: JetStream API calls of §2.2-§2.4 (stream info/create/update; consumer list/info/create/delete;
#: pull requests).
WORKER_PUBLISH: Final = (
    "_INBOX.>",
    "sie.health.>",
    "$JS.ACK.>",
    "$JS.API.STREAM.INFO.*",
    "$JS.API.STREAM.CREATE.*",
    "$JS.API.STREAM.UPDATE.*",
    "$JS.API.CONSUMER.LIST.*",
    "$JS.API.CONSUMER.NAMES.*",
    "$JS.API.CONSUMER.INFO.*.*",
    "$JS.API.CONSUMER.CREATE.>",
    "$JS.API.CONSUMER.DURABLE.CREATE.*.*",
    "$JS.API.CONSUMER.DELETE.*.*",
    "$JS.API.CONSUMER.MSG.NEXT.*.*",
)


def _quoted(subjects: tuple[str, ...]) -> str:
    return ", ".join(f'"{s}"' for s in subjects)


def authorization_block(user: str, password: str) -> str:
    """A nats-server config `authorization` entry for the worker user with exactly these permissions
    (the password is written as given: use a bcrypt hash from `nats server passwd` in production)."""
    return (
        f'{{user: "{user}", password: "{password}", permissions: {{\n'
        f"  subscribe: [{_quoted(WORKER_SUBSCRIBE)}]\n"
        f"  publish: [{_quoted(WORKER_PUBLISH)}]\n"
        f"}}}}"
    )


__all__ = ["WORKER_PUBLISH", "WORKER_SUBSCRIBE", "authorization_block"]
