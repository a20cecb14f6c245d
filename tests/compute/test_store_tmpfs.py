"""A store into a real, too-small tmpfs: ENOSPC is a clear error and the chunks already written stay."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import TargetWriteError


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or done.returncode})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_tmpfs_is_a_clear_error_and_keeps_the_chunks_written(tmp_path, small_tmpfs):
    data = np.random.default_rng(0).standard_normal((1024, 1024)).astype("f4")  # 4 MiB, incompressible
    np.save(tmp_path / "a.npy", data)
    target = str(small_tmpfs / "out.zarr")
    x = ds.open(str(tmp_path / "a.npy"), chunks=(64, 1024))  # 16 chunks of 256 KiB
    with ds.session("sync", progress=False), pytest.raises(TargetWriteError) as info:
        ds.store(x, target, compressor=None)
    assert isinstance(info.value, OSError)
    assert "No space left on device" in str(info.value)
    assert target in str(info.value)
    written = zarr.open_array(target, mode="r")
    done = [i for i in range(16) if (small_tmpfs / "out.zarr" / "c" / str(i) / "0").exists()]
    assert done  # some chunks made it before the disk filled
    for i in done:
        np.testing.assert_array_equal(written[i * 64 : (i + 1) * 64], data[i * 64 : (i + 1) * 64])
