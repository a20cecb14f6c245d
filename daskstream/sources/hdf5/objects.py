"""HDF5 files on an object store, open in this process: h5py reading through an :class:`ObjectFile`.

Such files are kept open in :mod:`daskstream.sources.handles`' cache, and closed
here before the interpreter exits: h5py crashes it when a file opened on a
Python file object is still open then.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import weakref

from daskstream.sources.contiguous import ObjectBytes, ObjectFile
from daskstream.sources.handles import cached_handle
from daskstream.sources.hdf5.filters import import_h5py
from daskstream.sources.objects.places import public_options


class _ObjectHdf5:
    """An HDF5 file on an object store, open in this process: h5py reading through an :class:`ObjectFile`."""

    def __init__(self, data: ObjectBytes, head: bytes) -> None:
        self.raw = ObjectFile(data, head)
        try:
            self.h5 = import_h5py().File(self.raw, "r")
        except OSError:
            failure = self.take_failure()  # the object changed or vanished: say that, not what HDF5 made of it
            if failure is not None:
                raise failure from None
            raise
        _open_object_files.add(self)

    def take_failure(self) -> BaseException | None:
        """The error a read through the file raised inside h5py, once (h5py may report it as its own)."""
        failure, self.raw.failure = self.raw.failure, None
        return failure

    def close(self) -> None:
        # h5py's file first: it may still write back to (flush through) the object file.
        self.h5.close()
        self.raw.close()


# h5py crashes the interpreter at exit when a file opened on a Python file object is still open
# then (its driver calls back into objects already torn down): they are closed first.
_open_object_files: weakref.WeakSet[_ObjectHdf5] = weakref.WeakSet()


def _close_object_files() -> None:
    for opened in list(_open_object_files):
        with contextlib.suppress(Exception):  # closing at exit: nothing is left to report it to
            opened.close()


atexit.register(_close_object_files)


# A forked child must not close its parent's files at its own exit.
os.register_at_fork(after_in_child=_open_object_files.clear)


def object_hdf5(path: str, data: ObjectBytes, head: bytes) -> _ObjectHdf5:
    """This process's h5py file over the object at ``path``, opened once per version of it."""
    # The same URL on another endpoint is another object: the options (without secrets) are part of the key.
    reached = json.dumps(public_options(data.place.storage_options), sort_keys=True, default=repr)
    key = ("hdf5-object", path, reached, data.size, data.version)
    return cached_handle(key, lambda: _ObjectHdf5(data, head))
