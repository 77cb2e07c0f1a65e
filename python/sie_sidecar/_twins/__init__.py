# SPDX-License-Identifier: Apache-2.0
"""Pure-Python twins of the native core: the same API as their `sie_sidecar._native` counterparts, for
parity tests, debugging and benchmark baselines. Imported only by `wire._switch` and by tests.

The wire facade is loaded first. The twin wire's modules import constants from `sie_sidecar.wire`,
and that package picks its implementation as it loads: under `SIE_SIDECAR_NO_EXTENSIONS=1`, the
twin wire itself. Were a twin wire module the first import, the facade would meet a twin wire that
had only begun to load (tests/unit/test_native.py imports each twin first)."""

import sie_sidecar.wire  # noqa: F401  (for its side effect: the implementation chosen, the twin wire loaded)
