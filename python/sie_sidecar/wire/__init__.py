# SPDX-License-Identifier: Apache-2.0
"""The wire core's public API: the compiled core, or the pure-Python twin when
`SIE_SIDECAR_NO_EXTENSIONS=1` (see docs/api.md).

Import names from here, not from `_native_api` or `_twins.wire`: both expose the same API, and `_switch`
is where the choice is made once per process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._switch import USING_NATIVE, wire_impl

if TYPE_CHECKING:
    # Type checkers see the compiled core's signatures (its stubs, `_native/*.pyi`); the parity tests
    # and stubtest keep the twins equal to them.
    from ._native_api import *  # noqa: F403
    from ._native_api import __all__ as _names
else:
    _names = list(wire_impl.__all__)
    globals().update({name: getattr(wire_impl, name) for name in _names})

__all__ = [*_names, "USING_NATIVE"]  # noqa: PLE0604
