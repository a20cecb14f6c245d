"""A budget refused before a byte is read names one that works: applied, the same analysis plans, computes
numpy's answer, and decodes each storage chunk a few times at most (not once per sliver of it)."""

from __future__ import annotations

import re

import dask
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import MemoryBudgetError
from daskstream.planning.chunks import MAX_DECODED_AMPLIFICATION

SHAPE, STORAGE = (4 * 365, 24, 40), (365, 24, 40)  # 1.4 MB storage chunks, decoded whole (zstd)


@pytest.fixture(scope="module")
def yearly(tmp_path_factory):
    path = tmp_path_factory.mktemp("advice") / "yearly.zarr"
    data = np.random.default_rng(11).standard_normal(SHAPE).astype("f4")
    array = zarr.create_array(
        str(path), shape=SHAPE, chunks=STORAGE, dtype="f4", compressors=zarr.codecs.ZstdCodec(level=3)
    )
    array[...] = data
    return str(path), data


def advised(error: MemoryBudgetError) -> str:
    found = re.search(r"at least ([\d.]+ [KMG]iB)", str(error))
    assert found, str(error)
    return found.group(1).replace(" ", "")


@pytest.mark.parametrize("budget", ["1MiB", "3MiB", "5MiB"])
def test_the_budget_a_refusal_names_works(yearly, budget):
    path, data = yearly
    with pytest.raises(MemoryBudgetError) as refused:
        ds.open(path, memory_budget=budget)
    enough = advised(refused.value)
    x = ds.open(path, memory_budget=enough)
    plan = ds.plan(path, memory_budget=enough)
    assert plan.read_amplification <= MAX_DECODED_AMPLIFICATION
    assert x.chunks == plan.dask_chunks
    with dask.config.set(scheduler="threads", num_workers=2):
        np.testing.assert_allclose(x.mean(axis=0, dtype="f8").compute(), data.mean(axis=0, dtype="f8"), rtol=1e-9)
