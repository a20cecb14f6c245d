"""Fixtures shared by the source tests."""

from __future__ import annotations

import uuid

import fsspec
import pytest

from daskstream.sources.handles import forget_handles


@pytest.fixture(autouse=True)
def _close_cached_handles():
    # Every test writes fresh files; closing the per-process handles afterwards keeps
    # hundreds of tests from holding hundreds of HDF5 / zip files open.
    yield
    forget_handles()


@pytest.fixture
def memory_url():
    """A fresh ``memory://`` location, removed after the test (the memory filesystem is process-global)."""
    root = f"daskstream-test-{uuid.uuid4().hex}"
    yield f"memory://{root}"
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)
