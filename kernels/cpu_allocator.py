"""Keep glibc from handing large activation buffers back to the OS.

On the CPU path every decode step allocates and frees a few MB-sized tensors
(gathered K/V, MLP activations). With glibc's defaults those are served by
mmap or trimmed from the heap top on free, so the next step page-faults them in
again, and the faults cost more than the kernels that use the memory (paged
decode attention at large batches). Raising the trim threshold and pinning the
mmap threshold makes freed memory reusable. Process-wide, idempotent, Linux
glibc only; ``kernels.dispatch.configure(tune_malloc=False)`` (a server's
KERNELS_TUNE_MALLOC=0) leaves the allocator alone.
"""

from __future__ import annotations

import ctypes
import sys
import threading

from kernels.config import current

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_TRIM_THRESHOLD = 1 << 30  # keep up to 1 GiB of freed heap for reuse
_MMAP_THRESHOLD = 32 << 20  # glibc's maximum; larger blocks still use mmap

_lock = threading.Lock()
_done: bool | None = None


def tune_cpu_allocator() -> bool:
    """Apply the settings once; returns whether they are in effect."""
    global _done
    if _done is not None:
        return _done
    with _lock:
        if _done is not None:
            return _done
        _done = False
        if not current().tune_malloc or not sys.platform.startswith("linux"):
            return _done
        try:
            libc = ctypes.CDLL("libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # musl or another libc
            return _done
        ok = mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
        ok = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) == 1 and ok
        _done = ok
        return _done
