"""Helpers shared by the source tests: the oracle comparison and file-stamp control."""

from __future__ import annotations

import os

import numpy as np


def native_dtype(dtype: np.dtype) -> np.dtype:
    """What a read must return for data stored as ``dtype``: the same type in native byte order."""
    return dtype.newbyteorder("=")


def assert_same_array(got: np.ndarray, expected: np.ndarray) -> None:
    """``got`` is exactly ``expected``: same shape, same values bit for bit, in native byte order.

    Comparing bytes rather than values makes NaNs (and NaN payloads) count, and
    needs no per-dtype equality rules for strings, datetimes or records.
    """
    assert isinstance(got, np.ndarray), f"expected an ndarray, got {type(got).__name__}"
    assert got.dtype.isnative, f"{got.dtype} is not in native byte order"
    assert got.dtype == native_dtype(expected.dtype)
    assert got.shape == expected.shape
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expected.astype(got.dtype)).tobytes()


def bump_mtime(path: str | os.PathLike[str], seconds: int = 10) -> None:
    """Move the modification time of ``path`` (and everything below it) ``seconds`` into the future.

    Rewrites within one clock tick can keep the same mtime on coarse filesystems;
    this makes "the file changed" unambiguous without sleeping.
    """
    targets = [os.fspath(path)]
    if os.path.isdir(path):
        for parent, dirs, files in os.walk(path):
            targets.extend(os.path.join(parent, name) for name in (*dirs, *files))
    for target in targets:
        mtime = os.stat(target).st_mtime_ns + seconds * 10**9
        os.utime(target, ns=(mtime, mtime))
