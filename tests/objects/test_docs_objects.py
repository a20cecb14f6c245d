"""The documentation's object store example and commands work as written, against the S3 server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest
import zarr

README_ENDPOINT = "http://127.0.0.1:9000"


def _section(repo_root) -> str:
    page = (repo_root / "docs" / "guide" / "formats.md").read_text()
    return page.split("## On object stores", 1)[1].split("\n## ", 1)[0]


@pytest.fixture
def bucket_named_bucket(s3, tmp_path):
    """The bucket the README names, holding field.zarr and scan.h5."""
    if "bucket" not in s3.fs.ls(""):
        s3.fs.call_s3("create_bucket", Bucket="bucket")
    field = np.random.default_rng(7).standard_normal((120, 80)).astype("f4")
    store = zarr.storage.FsspecStore.from_url("s3://bucket/field.zarr", storage_options=s3.options)
    zarr.create_array(store, shape=field.shape, dtype=field.dtype, chunks=(40, 40), overwrite=True)[...] = field
    scan = np.arange(6000, dtype="i2").reshape(60, 100)
    with h5py.File(tmp_path / "scan.h5", "w") as f:
        f.create_dataset("/entry/data", data=scan, chunks=(20, 50), compression="gzip")
    s3.fs.put_file(str(tmp_path / "scan.h5"), "bucket/scan.h5")
    yield field, scan
    s3.fs.rm("bucket", recursive=True)


def test_the_python_example_runs(repo_root, s3, bucket_named_bucket):
    field, scan = bucket_named_bucket
    example = re.findall(r"```python\n(.*?)```", _section(repo_root), flags=re.S)[0]
    scope: dict = {}
    exec(compile(example.replace(README_ENDPOINT, s3.endpoint), "README.md", "exec"), scope)
    np.testing.assert_array_equal(scope["x"].compute(), field)
    np.testing.assert_array_equal(scope["h"].compute(), scan)
    written = zarr.open_array(
        zarr.storage.FsspecStore.from_url("s3://bucket/anomaly.zarr", storage_options=s3.options), mode="r"
    )[...]
    np.testing.assert_allclose(written, field - field.mean(dtype="f8"), rtol=1e-5, atol=1e-5)


def test_the_commands_run_with_a_profile_or_an_endpoint(repo_root, s3, bucket_named_bucket, tmp_path):
    commands = re.findall(r"```bash\n(.*?)```", _section(repo_root), flags=re.S)[0].strip().splitlines()
    np.save(tmp_path / "field.npy", bucket_named_bucket[0])
    # The profile the README names, in a configuration file of its own, with the endpoint in it.
    config = tmp_path / "aws-config"
    config.write_text(
        f"[profile science]\naws_access_key_id = testing\naws_secret_access_key = testing\n"
        f"region = us-east-1\nendpoint_url = {s3.endpoint}\n"
    )
    # A profile named explicitly is used instead of the environment's credentials; its endpoint is the server.
    env = {**os.environ, "AWS_CONFIG_FILE": str(config)}
    for command in commands:
        args = command.split()[1:]
        args = [a.replace(README_ENDPOINT, s3.endpoint) for a in args]
        run = subprocess.run(
            [sys.executable, "-m", "daskstream", *args, "--json"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=120,
        )
        assert run.returncode == 0, (command, run.stderr)
        assert json.loads(run.stdout)
