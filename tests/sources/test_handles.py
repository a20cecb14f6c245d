"""The per-process handle cache: one open per file, slow opens hold up no other file, bounded size."""

from __future__ import annotations

import gc
import threading

import dask.config
import h5py
import numpy as np
import pytest

import daskstream as ds
from daskstream.errors import InvalidArgumentError
from daskstream.sources.handles import cached_handle, open_handle_count


def test_a_slow_open_holds_up_no_other_file():
    released = threading.Event()
    started = threading.Event()

    def slow() -> str:
        started.set()
        assert released.wait(10)
        return "slow handle"

    opener = threading.Thread(target=cached_handle, args=(("test", "slow"), slow))
    opener.start()
    assert started.wait(10)
    # While "slow" is opening, another key opens (and an opened one is found) without waiting for it.
    assert cached_handle(("test", "fast"), lambda: "fast handle") == "fast handle"
    assert cached_handle(("test", "fast"), lambda: "opened twice") == "fast handle"
    released.set()
    opener.join(10)
    assert cached_handle(("test", "slow"), lambda: "opened twice") == "slow handle"


def test_threads_asking_for_one_file_at_once_open_it_once():
    opened = []
    gate = threading.Barrier(8)

    def opener() -> object:
        opened.append(1)
        return object()

    results = []

    def ask() -> None:
        gate.wait(10)
        results.append(cached_handle(("test", "shared"), opener))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(opened) == 1
    assert len({id(r) for r in results}) == 1


def test_an_opener_may_open_another_handle():
    outer = cached_handle(("test", "outer"), lambda: ("outer", cached_handle(("test", "inner"), lambda: "inner")))
    assert outer == ("outer", "inner")


def test_reading_many_files_keeps_a_bounded_number_open(tmp_path):
    open_files = h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE)
    with dask.config.set({"daskstream.sources.max-open-files": 4}):
        for number in range(12):
            path = tmp_path / f"x{number}.h5"
            with h5py.File(path, "w") as f:
                f.create_dataset("d", data=np.full(100, number, dtype="f8"), chunks=(10,), compression="gzip")
            assert ds.open(f"{path}::d").sum().compute() == 100 * number
            assert open_handle_count() <= 4
        gc.collect()
        # Files let go of are closed once nothing uses them: not one per file read stays open.
        assert h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE) - open_files <= 4


def test_the_bound_must_be_a_whole_number():
    with (
        dask.config.set({"daskstream.sources.max-open-files": 0}),
        pytest.raises(InvalidArgumentError, match="at least 1"),
    ):
        cached_handle(("test", "bounded"), lambda: "x")
