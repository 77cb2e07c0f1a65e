# SPDX-License-Identifier: Apache-2.0
"""The only package that imports nats: connection, pull, inbound fast path, outbound writer, publisher, topology,
control subscriptions and the health publisher. A change of nats-py internals is a change in this room."""
