# SPDX-License-Identifier: Apache-2.0
"""The control plane's HTTP clients: the gateway's `/v1/pools` poller (pool admission, §8). What they
learn is recorded in transport-free state (`pipeline.admission`) that the pull gate and intake read."""
