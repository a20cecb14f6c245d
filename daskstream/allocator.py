"""How glibc's allocator keeps freed memory: in fewer heaps, so memory freed by one thread serves the next, and
with a few MiB kept free at each heap's top, so a task's next piece reuses the pages its last one freed.

glibc gives each thread that allocates while another does a heap (arena) of
its own, up to eight per CPU, and each keeps the blocks freed into it for
its own thread's later use. A computation's threads (dask's, the stream's
readers, zarr's I/O) then each keep a block-sized reserve that none of the
others can use: measured here, a Zarr store that holds 52 MiB at a time kept
86 to 97 MiB resident. Capping the arenas at the number of usable CPUs
(``daskstream.compute.malloc-arenas``) lets freed blocks be reused across
threads, at no measured cost in speed. Set it to ``none`` to leave the
allocator alone; outside glibc nothing is changed.

The cap is a change to the whole process, so importing daskstream makes none:
it is set where daskstream starts work of its own (entering a
:func:`~daskstream.session`, iterating a stream, the ``daskstream`` command),
from the setting then in force.

A task streaming its block piece by piece frees each piece and its temporaries
(a variance's float64 copies) before allocating the next piece's. glibc gives
back the memory at a heap's top beyond twice the largest mapped block freed so
far, so pieces of 1 MiB whose temporaries add up to 5 MiB were given back and
faulted in again for every piece: a million page faults for a variance of
1 GiB, most of a core's time. Keeping ``daskstream.compute.malloc-top-pad``
bytes free at the top of each heap (glibc's ``M_TOP_PAD``) keeps those pages,
at that many bytes per heap held when nothing runs. Blocks of a mebibyte or
two read whole (``chunks="storage"``) fault the same way, so the pad is set by
the first read of a source in a process (:meth:`daskstream.Source.read`), from
the setting then in force. Setting it stops glibc's threshold for mapping a
block apart from the heaps from sliding up with the blocks freed, so the
threshold is set too, to the 32 MiB glibc slides it to at most: left at its
first 128 KiB, every piece would be mapped apart and faulted in afresh. Where
the environment tunes glibc's allocator itself (``MALLOC_TOP_PAD_`` and its
kin, ``glibc.malloc`` tunables), it is left as the environment says.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

from dask.system import cpu_count

from daskstream import config
from daskstream.planning.budget import parse_budget

# glibc's mallopt parameters (malloc.h): the most arenas, and the free bytes a heap keeps at its top.
_M_ARENA_MAX = -8
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

#: Blocks this large or larger are mapped apart from the heaps (and given back when freed): the most glibc's own
#: sliding threshold reaches on a 64-bit machine (malloc.c: DEFAULT_MMAP_THRESHOLD_MAX).
MAPPED_APART_BYTES = 32 * 2**20

_padded: list[int | None] = []  # the pad set in this process, once set
_padding = threading.Lock()


def cap_malloc_arenas() -> int | None:
    """Cap the arenas as ``daskstream.compute.malloc-arenas`` says (``none``: leave them); the cap set."""
    return limit_malloc_arenas(config.get("compute.malloc-arenas"))


def limit_malloc_arenas(setting: int | str | None) -> int | None:
    """Cap glibc's arenas at ``setting`` (``"auto"``: the usable CPUs, at least 2); the cap set, or ``None``.

    >>> limit_malloc_arenas(None) is None
    True
    """
    if setting in (None, "none", 0) or not _glibc():
        return None
    count = max(2, cpu_count()) if setting == "auto" else int(setting)  # the usable CPUs: affinity and quota counted
    return count if _mallopt(_M_ARENA_MAX, count) else None


def pad_heap_tops() -> int | None:
    """Keep ``daskstream.compute.malloc-top-pad`` bytes free at the top of each heap (``none``: leave them), the
    first time it is called in this process (a source's first read); the pad set, or ``None``."""
    if not _padded:
        with _padding:
            if not _padded:
                setting = config.setting("compute.malloc-top-pad")
                _padded.append(keep_at_heap_tops(setting))
    return _padded[0]


def keep_at_heap_tops(setting: int | str | None) -> int | None:
    """Have glibc keep ``setting`` bytes (``"16MiB"``, say) free at the top of each heap when it gives memory back,
    and take blocks under :data:`MAPPED_APART_BYTES` from the heaps; the bytes kept, or ``None`` where left alone
    (``none``, or no glibc).

    >>> keep_at_heap_tops("none") is None
    True
    """
    if setting in (None, "none", 0):
        return None
    pad = min(parse_budget(setting, name="daskstream.compute.malloc-top-pad"), 2**31 - 1)  # mallopt takes an int
    if not _glibc() or _tuned_by_environment():
        return None
    # Either call stops glibc sliding the threshold; the pad alone would leave it at 128 KiB.
    return pad if _mallopt(_M_MMAP_THRESHOLD, MAPPED_APART_BYTES) and _mallopt(_M_TOP_PAD, pad) else None


def _glibc() -> bool:
    """Whether this process runs on glibc (not musl, not macOS or Windows)."""
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


#: The environment's own tuning of glibc's allocator, which daskstream leaves as it says.
_ENVIRONMENT_TUNING = ("MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_")


def _tuned_by_environment() -> bool:
    return any(name in os.environ for name in _ENVIRONMENT_TUNING) or "glibc.malloc." in os.environ.get(
        "GLIBC_TUNABLES", ""
    )


def _mallopt(parameter: int, value: int) -> bool:
    """glibc's ``mallopt(parameter, value)``, looked up in the C library this process runs on; whether it took."""
    with contextlib.suppress(OSError, AttributeError):
        return bool(ctypes.CDLL(None).mallopt(parameter, value) == 1)
    return False


__all__ = ["MAPPED_APART_BYTES", "cap_malloc_arenas", "keep_at_heap_tops", "limit_malloc_arenas", "pad_heap_tops"]
