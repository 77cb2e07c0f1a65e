# SPDX-License-Identifier: Apache-2.0
"""Transport-free stages between "a batch of deliveries arrived" and "these outcomes must be settled":
delivery and settlement rules, intake, readiness, replies; `dispatcher` only sequences them. Nothing here
imports nats or opens a socket: a `Source` hands batches in, a settle handle per delivery takes verdicts out."""
