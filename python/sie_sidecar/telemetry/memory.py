"""Live memory as the allocators see it, for `/debug/state` and the soak: the C heap (glibc's
`mallinfo2`) and Python's own small-object allocator (`sys.getallocatedblocks`), which serves most
objects from arenas it maps itself, out of glibc's sight.

RSS mixes live memory with free space the allocator keeps: on glibc, 256 KiB socket receive buffers
that land in the main heap (after its mmap threshold has risen) leave holes the heap grows around,
so RSS climbs a few MB while the bytes in use stay flat (docs/reliability.md, "Soak"). A leak shows
in `in_use_bytes` or `python_blocks`; fragmentation only in `free_bytes`.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from functools import cache
from typing import Any

_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


@cache
def _mallinfo2() -> Any:
    """glibc's `mallinfo2` (2.33+), or None on another C library or an older glibc."""
    try:
        # The process's own symbols (dlopen(NULL)) include the C library's; find_library would spawn
        # ldconfig from the event loop.
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _Mallinfo2
    function.argtypes = []
    return function


def memory_stats() -> dict[str, int]:
    """`python_blocks` (pymalloc blocks allocated), and where glibc's `mallinfo2` exists the C heap,
    summed over every arena: bytes in use (heap chunks plus mmapped blocks), free inside the heaps,
    held by the heaps, mmapped."""
    stats = {"python_blocks": sys.getallocatedblocks()}
    function = _mallinfo2()
    if function is None:
        return stats
    info = function()
    return stats | {
        "in_use_bytes": int(info.uordblks) + int(info.hblkhd),
        "free_bytes": int(info.fordblks),
        "heap_bytes": int(info.arena),
        "mmap_bytes": int(info.hblkhd),
    }


def gc_stats() -> dict[str, Any]:
    """The cyclic collector per generation: objects pending (`gc.get_count`), collections run and
    objects they freed so far. Freed objects were cyclic garbage, alive (as `python_blocks`) until a
    collection of their generation; a steady `collected` rise means something makes reference
    cycles on the hot path."""
    stats = gc.get_stats()
    return {
        "pending": list(gc.get_count()),
        "collections": [int(g["collections"]) for g in stats],
        "collected": [int(g["collected"]) for g in stats],
        "uncollectable": sum(int(g["uncollectable"]) for g in stats),
        "frozen": gc.get_freeze_count(),
    }


__all__ = ["gc_stats", "memory_stats"]
