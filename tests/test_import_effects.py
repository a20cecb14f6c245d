"""What importing daskstream changes: dask's default array optimizer, and nothing else of the process."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import dask
import dask.array as da
import numpy as np
import pytest
from dask.array.optimization import optimize as dask_optimize

import daskstream as ds
from daskstream.compute.streaming.optimizer import optimize_streaming
from daskstream.graph.optimize import optimize

# Counts glibc's arenas (malloc_info's <heap> entries) after eight threads have each allocated: glibc gives a
# thread that allocates for the first time an arena of its own until the cap (M_ARENA_MAX) is reached.
ARENAS = textwrap.dedent(
    """
    import ctypes, ctypes.util, json, os, re, sys, tempfile, threading

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.fopen.restype = ctypes.c_void_p

    def arenas():
        path = os.path.join(tempfile.mkdtemp(), "malloc.xml")
        stream = libc.fopen(path.encode(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(stream))
        libc.fclose(ctypes.c_void_p(stream))
        with open(path) as f:
            return len(re.findall(r'<heap nr="\\d+">', f.read()))

    def eight_threads_allocate():
        gate = threading.Barrier(8)

        def work():
            gate.wait()
            kept = [bytearray(100_000) for _ in range(50)]  # under the mmap threshold: from an arena
            gate.wait()

        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    import daskstream as ds
    if sys.argv[1] == "session":
        with ds.session("threads", progress=False):
            eight_threads_allocate()
    else:
        eight_threads_allocate()
    print(json.dumps(arenas()))
    """
)


def _arenas(where: str, setting: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_DASKSTREAM__COMPUTE__MALLOC")}
    if setting is not None:
        env["DASK_DASKSTREAM__COMPUTE__MALLOC_ARENAS"] = setting
    run = subprocess.run([sys.executable, "-c", ARENAS, where], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_importing_leaves_the_allocator_alone_and_a_session_caps_its_arenas_as_configured():
    assert _arenas("import") > 4  # a heap for each allocating thread: nothing was capped by the import
    assert _arenas("session", "2") <= 2
    assert _arenas("session", "none") > 4  # left alone when the setting says so


def test_a_top_pad_that_is_not_a_size_is_refused_naming_the_setting():
    from daskstream.allocator import keep_at_heap_tops
    from daskstream.errors import DaskstreamError

    with pytest.raises(DaskstreamError, match=r"daskstream\.compute\.malloc-top-pad='lots' is not a size") as refused:
        keep_at_heap_tops("lots")
    assert isinstance(refused.value, ValueError)
    assert keep_at_heap_tops("none") is None  # left alone


def test_an_allocator_the_environment_tunes_is_left_as_it_says(monkeypatch):
    from daskstream.allocator import keep_at_heap_tops

    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576")
    assert keep_at_heap_tops("16MiB") is None
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("MALLOC_TOP_PAD_", "1048576")
    assert keep_at_heap_tops("16MiB") is None


PAD_ONCE = textwrap.dedent(
    """
    import dask
    from daskstream.allocator import pad_heap_tops

    with dask.config.set({"daskstream.compute.malloc-top-pad": "8MiB"}):
        first = pad_heap_tops()
    with dask.config.set({"daskstream.compute.malloc-top-pad": "none"}):
        print(first, pad_heap_tops())
    """
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator")
def test_the_pad_is_set_once_a_process_from_the_setting_then_in_force():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    run = subprocess.run([sys.executable, "-c", PAD_ONCE], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(8 * 2**20)] * 2


def _same_graph(a, b) -> bool:
    a, b = dict(a), dict(b)
    return a.keys() == b.keys() and all(str(a[k]) == str(b[k]) for k in a)


def test_graphs_reading_no_daskstream_source_are_optimized_as_dask_does():
    x = da.ones((400, 300), chunks=(100, 100))
    y = ((x + 1) * 2).sum(axis=0)
    keys = y.__dask_keys__()
    assert _same_graph(optimize(y.__dask_graph__(), keys), dask_optimize(y.__dask_graph__(), keys))
    np.testing.assert_array_equal(y.compute(), np.full(300, 1600.0))


def test_the_optimizer_is_a_default_a_program_can_replace_and_a_setting_can_switch_off(tmp_path):
    assert dask.config.get("array_optimize") is optimize_streaming
    with dask.config.set(array_optimize=dask_optimize):
        assert dask.config.get("array_optimize") is dask_optimize
    path = str(tmp_path / "a.npy")
    np.save(path, np.arange(12.0).reshape(3, 4))
    y = ds.open(path).mean(axis=0)
    keys = y.__dask_keys__()
    with dask.config.set({"daskstream.compute.rewrite": False}):
        assert _same_graph(optimize(y.__dask_graph__(), keys), dask_optimize(y.__dask_graph__(), keys))
        np.testing.assert_array_equal(y.compute(), [4.0, 5.0, 6.0, 7.0])
