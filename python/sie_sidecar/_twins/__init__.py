# SPDX-License-Identifier: Apache-2.0
"""Pure-Python twins of the native core: the same API as their `sie_sidecar._native` counterparts, for
parity tests, debugging and benchmark baselines. Imported only by `wire._switch` and by tests."""
