"""The C library, for the Linux system calls Python does not wrap (the sweep's SysV IPC,
mount namespace and keyring calls)."""

from __future__ import annotations

import ctypes
import errno
import sys
from functools import lru_cache


@lru_cache(maxsize=1)
def c_library() -> ctypes.CDLL:
    if not sys.platform.startswith("linux"):
        raise OSError(errno.ENOSYS, "the uid sweep needs Linux")
    return ctypes.CDLL(None, use_errno=True)
