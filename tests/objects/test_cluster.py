"""Real ``dask scheduler`` and ``dask worker`` processes reading and writing S3: their own credentials, never ours."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import ObjectStoreCredentialsError


def _address(scheduler_file) -> str:
    return json.loads(scheduler_file.read_text())["address"]


@pytest.fixture
def field(s3):
    data = np.random.default_rng(5).standard_normal((200, 160)).astype("f4")
    url = f"s3://{s3.bucket()}/field.zarr"
    store = zarr.storage.FsspecStore.from_url(url, storage_options=s3.options)
    zarr.create_array(store, shape=data.shape, dtype=data.dtype, chunks=(50, 80))[...] = data
    return url, data


def test_workers_without_credentials_are_told_so_and_never_get_ours(
    s3, field, start_dask_processes, tmp_path, monkeypatch
):
    url, _ = field
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    scheduler_file = start_dask_processes(tmp_path, nworkers=1)  # started from this environment: none
    # This process has them, as options: it opens the array, its workers read it.
    options = {**s3.options, "key": "testing", "secret": "testing", "config_kwargs": {"user_agent_extra": "ours"}}
    with ds.session(_address(scheduler_file), progress=False):
        x = ds.open(url, storage_options=options)
        with pytest.raises(ObjectStoreCredentialsError, match="no valid credentials"):
            ds.reduce(x, "sum").compute()


def test_workers_with_credentials_read_and_store_exactly(s3, field, start_dask_processes, tmp_path):
    url, data = field
    scheduler_file = start_dask_processes(tmp_path, nworkers=2)
    with ds.session(_address(scheduler_file), progress=False):
        x = ds.open(url, storage_options=s3.options)
        assert float(ds.reduce(x, "sum")) == pytest.approx(float(data.sum(dtype="f8")), rel=1e-6)
        out = url.replace("field.zarr", "anomaly.zarr")
        ds.store(x - x.mean(axis=0), out, storage_options=s3.options)
    written = zarr.open_array(zarr.storage.FsspecStore.from_url(out, storage_options=s3.options), mode="r")[...]
    np.testing.assert_allclose(written, data - data.mean(axis=0, dtype="f8"), rtol=1e-5, atol=1e-5)
