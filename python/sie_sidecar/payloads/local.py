# SPDX-License-Identifier: Apache-2.0
"""Local payload reader (sidecar-behaviour §12): one pinned base directory, files opened with `openat2`.

The base directory is opened once, so renaming or replacing it later changes nothing. Every file is
opened relative to that descriptor with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS:
the kernel itself refuses `..` escapes, absolute symlinks and `/proc` magic links, so there is no
check-then-open race to win. Without `openat2` (non-Linux, kernels before 5.6, a seccomp filter that
hides it) every read fails with `unsupported`: there is no weaker fallback.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import stat
import sys
from collections.abc import Callable

from .errors import (
    InvalidPayloadRef,
    PayloadError,
    PayloadIOError,
    PayloadNotFound,
    PayloadOversized,
    PayloadPermissionDenied,
    PayloadUnsupported,
)

log = logging.getLogger(__name__)

SYS_OPENAT2 = 437  # one number on every Linux architecture (syscalls added after the table unification)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
_PROBE_READ = 1024 * 1024  # read size once the stat-sized read is done (EOF probe, or a file that grew)

_INVALID_REF_ERRNOS = frozenset({errno.ELOOP, errno.ENOTDIR, errno.EXDEV})
_PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM})


class _OpenHow(ctypes.Structure):
    """`struct open_how` of linux/openat2.h (version 0, 24 bytes)."""

    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


def _load_syscall() -> Callable[..., int] | None:
    """libc's variadic `syscall()`, or None where there is no Linux libc to call it through."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


_syscall = _load_syscall()


def openat2(dirfd: int, path: bytes, flags: int = OPEN_FLAGS, resolve: int = RESOLVE) -> int:
    """`openat2(2)`; raises `OSError` with the kernel's errno (ENOSYS where it does not exist)."""
    if _syscall is None:
        raise OSError(errno.ENOSYS, "openat2 is not available on this platform")
    if b"\0" in path:
        raise OSError(errno.EINVAL, "path contains a NUL byte")  # C would silently truncate at it
    how = _OpenHow(flags, 0, resolve)
    while True:
        fd = _syscall(
            ctypes.c_long(SYS_OPENAT2),
            ctypes.c_long(dirfd),
            ctypes.c_char_p(path),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EINTR:
            raise OSError(err, os.strerror(err))


def _components(path: str) -> list[str]:
    """Path components the way §12 reads them: empty components and `.` are ignored."""
    return [c for c in path.split("/") if c not in ("", ".")]


def relative_ref(ref: str, base_components: list[str]) -> str:
    """The path below the base that `ref` names; `InvalidPayloadRef` for anything else.

    A relative ref is taken as is; an absolute ref must lie under the base directory (compared
    component by component, without touching the filesystem). `..` anywhere is refused, as are the
    empty ref, the base itself and NUL bytes.
    """
    if not ref:
        raise InvalidPayloadRef("empty payload ref")
    if "\0" in ref:
        raise InvalidPayloadRef("payload ref contains a NUL byte")
    parts = _components(ref)
    if ref.startswith("/"):
        if parts[: len(base_components)] != base_components:
            raise InvalidPayloadRef("absolute payload ref outside the base directory")
        parts = parts[len(base_components) :]
    if ".." in parts:
        raise InvalidPayloadRef("payload ref contains '..'")
    if not parts:
        raise InvalidPayloadRef("payload ref names the base directory itself")
    return "/".join(parts)


def _open_error(exc: OSError) -> PayloadError:
    """Map an `openat2` errno onto the §12 / §13 reasons."""
    err = exc.errno
    if err == errno.ENOSYS:
        return PayloadUnsupported("openat2 is not available")
    if err in _INVALID_REF_ERRNOS:
        return InvalidPayloadRef(f"payload ref refused by the kernel: {exc.strerror}")
    if err == errno.ENOENT:
        return PayloadNotFound("payload file not found")
    if err in _PERMISSION_ERRNOS:
        return PayloadPermissionDenied("payload file not readable")
    return PayloadIOError(f"cannot open payload file: {exc.strerror}")


def read_bounded(fd: int, size_hint: int, limit: int) -> bytes:
    """Read to EOF, but never more than `limit + 1` bytes: a file that grew past `limit` is refused."""
    budget = limit + 1
    ask = min(max(size_hint, 0), limit) + 1
    parts: list[bytes] = []
    total = 0
    while total < budget:
        chunk = os.read(fd, min(ask, budget - total))
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
        ask = _PROBE_READ
    if total > limit:
        raise PayloadOversized(total, limit)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class LocalReader:
    """Reads refs beneath one directory, pinned by descriptor when the reader is built."""

    def __init__(self, base: str | None) -> None:
        self.base = base
        self._dirfd: int | None = None
        self._base_components: list[str] = []
        if not base:
            return  # no base directory (or an empty `file://`): every read is an invalid ref
        absolute = base if base.startswith("/") else os.path.join(os.getcwd(), base)
        self._base_components = _components(absolute)
        try:
            self._dirfd = os.open(absolute, _DIR_FLAGS)
        except OSError as exc:
            log.warning("payload base directory cannot be opened; every read will fail", extra={"error": str(exc)})
        if _syscall is None:
            log.warning("openat2 is unavailable; every local payload read will fail (unsupported)")

    @property
    def pinned(self) -> bool:
        """Whether a base directory is open (otherwise every read is an invalid ref)."""
        return self._dirfd is not None

    def read(self, ref: str, limit: int) -> bytes:
        """The file's bytes; a `PayloadError` subclass for every refusal (blocking: run it off the loop)."""
        if self._dirfd is None:
            raise InvalidPayloadRef("no usable payload base directory")
        rel = relative_ref(ref, self._base_components)
        try:
            fd = openat2(self._dirfd, os.fsencode(rel))
        except OSError as exc:
            raise _open_error(exc) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidPayloadRef("payload ref is not a regular file")
            if st.st_size > limit:
                raise PayloadOversized(st.st_size, limit)
            return read_bounded(fd, st.st_size, limit)
        except OSError as exc:
            raise PayloadIOError(f"cannot read payload file: {exc.strerror}") from None
        finally:
            os.close(fd)

    async def fetch(self, ref: str, limit: int) -> bytes:
        """`read` on a worker thread, so a slow disk never stalls the event loop."""
        return await asyncio.to_thread(self.read, ref, limit)

    def close(self) -> None:
        """Release the pinned directory (at shutdown, once no read is in flight)."""
        fd, self._dirfd = self._dirfd, None
        if fd is not None:
            os.close(fd)


__all__ = ["OPEN_FLAGS", "RESOLVE", "LocalReader", "openat2", "read_bounded", "relative_ref"]
