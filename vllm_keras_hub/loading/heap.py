"""Handing memory freed while loading back to the operating system.

Loading reads each weight, packs it for vLLM's CPU GEMM and frees Keras's
copy. glibc serves an allocation from `mmap` (and returns it at `free`)
only above its mmap threshold, which it raises to the size of each large
block freed, up to 32 MiB; a weight of a 1B model (a 1152 x 6912 float32
kernel is 31.9 MB) then lives in the heap, and freeing it leaves pages the
process keeps. On a Gemma3-1B shape that was 4.4 GB of a worker's 11.0 GB
after loading. `malloc_trim` returns them.
"""

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    return getattr(ctypes.CDLL(name), "malloc_trim", None)  # glibc only


def release_free_memory():
    """Returns the C heap's free pages to the OS, where libc can (glibc).

    Returns:
        Whether it could.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
