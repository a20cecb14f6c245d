"""Replacing what a target holds by swap: the new array is written beside the old and put in its place whole.

``store(..., overwrite=True)`` never deletes what a target holds before its
replacement is complete. The computation may read the very array it replaces
through any reader -- a daskstream source, ``da.from_zarr``, an xarray backend
array, a closure -- and no list of readers is ever complete, so the old array
stays untouched while the new one is written under a name of its own beside
it (a *staging* array, resumable like any store), and the two change places
only once the staging array is finished:

1. the old array is renamed aside (``.NAME.daskstream-old``),
2. the staging array is renamed into its place,
3. the old array is removed.

Each step is one ``rename`` of a folder (or, in HDF5, of a link). A process
killed between two steps leaves both arrays whole; the next store into the
target finishes the swap, or puts the old array back if the new one was not
in place yet (:func:`recover_folder`).

A swap needs the space of both arrays until the old one is removed.

A store of several arrays at once (a Dataset's variables) swaps them all only
once every one is whole (:func:`swaps_together`): one variable computed from
another of the same store never reads the other's replacement.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
from collections.abc import Callable, Iterator

from daskstream.runtime.stopping import deferred_stop

#: The suffixes of the two names a swap uses beside a target.
STAGING_SUFFIX = ".daskstream-new"
ASIDE_SUFFIX = ".daskstream-old"


def staging_name(name: str) -> str:
    """The name the new array is written under beside the target ``name`` (a hidden one).

    >>> staging_name("field.zarr")
    '.field.zarr.daskstream-new'
    """
    return f".{name}{STAGING_SUFFIX}"


def aside_name(name: str) -> str:
    """The name the old array takes while the new one moves into its place.

    >>> aside_name("field.zarr")
    '.field.zarr.daskstream-old'
    """
    return f".{name}{ASIDE_SUFFIX}"


def staged_places(store_root: str, array_folder: str, member: str | None) -> tuple[str, str]:
    """Where a folder array at ``array_folder`` (``member`` of the store at ``store_root``) is staged and put aside.

    Beside the store's root, outside any Zarr hierarchy (a group lists every
    folder in it as a member, hidden or not), when a rename reaches the array's
    folder from there; else beside the array itself.

    >>> staged_places("/data/out.zarr", "/data/out.zarr/temperature", "temperature")
    ('/data/.out.zarr.temperature.daskstream-new', '/data/.out.zarr.temperature.daskstream-old')
    """
    parent, root = os.path.split(os.path.abspath(store_root))
    label = root if not member else f"{root}.{member.strip('/').replace('/', '.')}"
    if member and not _one_device(parent, os.path.dirname(os.path.abspath(array_folder))):
        parent, label = os.path.split(os.path.abspath(array_folder))
    return os.path.join(parent, staging_name(label)), os.path.join(parent, aside_name(label))


def _one_device(first: str, second: str) -> bool:
    """Whether the folders ``first`` and ``second`` (or, where absent, the nearest folder above) share a device."""

    def device(folder: str) -> int | None:
        while True:
            try:
                return os.stat(folder).st_dev
            except OSError:
                if os.path.dirname(folder) == folder:
                    return None
                folder = os.path.dirname(folder)

    return device(first) == device(second)


def swap_folders(staged: str, target: str, aside: str) -> None:
    """Put the finished folder ``staged`` in the place of ``target`` (which may be absent), then remove the old one.

    A signal waits for the renames (a stop between them would leave the
    target absent until the next store); an error leaves the old folder in
    place.
    """
    with deferred_stop():
        if os.path.lexists(aside):
            shutil.rmtree(aside)  # a swap done before, whose old folder was not removed yet
        moved = False
        if os.path.lexists(target):
            os.replace(target, aside)
            moved = True
        try:
            os.replace(staged, target)
        except BaseException:
            if moved:
                os.replace(aside, target)
            raise
    shutil.rmtree(aside, ignore_errors=True)


def recover_folder(target: str, staged: str, aside: str) -> None:
    """Finish a swap into ``target`` cut short by a killed process, or undo it: both arrays stay whole.

    An old folder still aside means the process stopped within
    :func:`swap_folders`: if the target is in place the old one only awaits
    removal; if not, the staging folder (complete, or the swap would not have
    begun) moves in, and without one the old folder moves back.
    """
    if not os.path.isdir(aside) or os.path.islink(aside):
        return
    with deferred_stop():
        if not os.path.lexists(target):
            if not os.path.isdir(staged):
                os.replace(aside, target)
                return
            os.replace(staged, target)
    shutil.rmtree(aside, ignore_errors=True)


# The swaps waiting for the end of a swaps_together block (None outside one).
_WAITING: contextvars.ContextVar[list[Callable[[], None]] | None] = contextvars.ContextVar(
    "daskstream_waiting_swaps", default=None
)


@contextlib.contextmanager
def swaps_together() -> Iterator[None]:
    """Within the block, stores that replace arrays write each beside its target and put none in place; all
    are put in place, in order, when the block ends without an error (after one, each stays staged, resumable).
    """
    waiting: list[Callable[[], None]] = []
    token = _WAITING.set(waiting)
    try:
        yield
    finally:
        _WAITING.reset(token)
    for swap in waiting:
        swap()


def swap_when_whole(swap: Callable[[], None]) -> None:
    """Run ``swap`` now, or at the end of the :func:`swaps_together` block this is in."""
    waiting = _WAITING.get()
    if waiting is None:
        swap()
    else:
        waiting.append(swap)
