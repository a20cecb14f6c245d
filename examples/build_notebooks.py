"""Write the example notebooks from the cells below, run each top to bottom, and save them with their outputs.

    python examples/build_notebooks.py              # both
    python examples/build_notebooks.py labelled     # labelled.ipynb only

``quickstart.ipynb`` walks through the formats, the plan, statistics, a
stencil, tuning and streaming; ``labelled.ipynb`` through NetCDF files as an
xarray user meets them: names, units, coordinates, many files. Edit the cells
here, not the notebooks, so the two never drift apart; the test suite runs
the saved notebooks again and fails on any error.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

QUICKSTART = [
    (
        "markdown",
        """# daskstream quick start

Open a generated sample in each format, look at how it is stored and how daskstream plans to read it,
compute statistics and a stencil, tune chunks for this machine, and stream batches for a training loop.
Everything runs on a 64 MiB sample in a temporary folder.""",
    ),
    (
        "code",
        """import os
import tempfile

import dask
import numpy as np

import daskstream as ds
from daskstream.demo import write_sample

folder = tempfile.mkdtemp(prefix="daskstream-quickstart-")
# Tuning results go to a private cache here, so this notebook leaves the user's cache alone.
dask.config.set({"daskstream.tune.cache": os.path.join(folder, "tune.json")})
paths = {
    fmt: write_sample(os.path.join(folder, f"field.{ext}"), fmt, "64MiB")
    for fmt, ext in (("npy", "npy"), ("hdf5", "h5"), ("zarr", "zarr"))
}
paths""",
    ),
    ("markdown", "## Sources: how the data sits on disk\nStorage chunks are drawn in grey."),
    ("code", 'ds.open_source(paths["zarr"])'),
    (
        "markdown",
        "## The chunk plan\nTasks (blue) are whole storage chunks, sized to the memory budget and the threads. "
        "Open *why* for the reasons.",
    ),
    ("code", 'ds.plan(paths["hdf5"], memory_budget="1GiB")'),
    (
        "markdown",
        "Every axis is drawn: a daily time series of maps, stored a month of days per chunk, is split along time.",
    ),
    (
        "code",
        """import h5py

series = os.path.join(folder, "series.h5")
with h5py.File(series, "w") as f:
    f.create_dataset("sst", shape=(365, 180, 360), dtype="f4", chunks=(30, 90, 180), compression="gzip")
ds.plan(f"{series}::sst", memory_budget="64MiB")""",
    ),
    (
        "markdown",
        "## One pass of statistics\nCount, NaN count, mean, standard deviation, minimum and maximum; "
        "exact quartiles and a histogram on request.",
    ),
    (
        "code",
        """x = ds.open(paths["zarr"])
with ds.session("threads") as s:  # a progress bar shows for computations longer than half a second
    (stats,) = s.compute(ds.describe(x, bins=20, quartiles=True))
stats""",
    ),
    ("code", "stats.to_dataframe()"),
    ("markdown", "## A stencil kernel with a halo, stored out of core"),
    (
        "code",
        """def box3(block):
    \"\"\"Mean of each cell's 3x3 neighbourhood.\"\"\"
    padded = np.pad(block, 1, mode="edge")
    rows, cols = block.shape
    return sum(padded[dy : dy + rows, dx : dx + cols] for dy in range(3) for dx in range(3)) / 9


smooth = ds.map_blocks(box3, ds.open(paths["npy"]), depth=1, boundary="nearest", dtype="f4")
target = os.path.join(folder, "smooth.zarr")
ds.store(smooth, target)
ds.open_source(target)""",
    ),
    (
        "markdown",
        "## Tune chunks on this machine\nThe tuner times storage-aligned chunk shapes around the planner's "
        "choice and remembers the winner for this kind of data.",
    ),
    (
        "code",
        """# A 64 MiB sample is small for tuning: let it read the array twice over, and take longer than\n# a full run, to try a few shapes (on large arrays it reads at most 10% and takes about 7% of a run).
settings = {
    "daskstream.tune.sample-fraction": 2.0,
    "daskstream.tune.cost-fraction": 10.0,
    "daskstream.tune.min-batch-bytes": "1MiB",
}
with dask.config.set(settings):
    result = ds.tune(paths["zarr"], op="sum", time_budget="5s")
result""",
    ),
    ("code", 'x = ds.open(paths["zarr"], chunks="tune")  # remembered: no measuring\nx.chunksize == result.chunks'),
    (
        "markdown",
        "## Stream batches for a training loop\nStorage-aligned shards read ahead of the loop, shuffled within a "
        "bounded window, every row exactly once per epoch; the same split on every rank of a distributed run.",
    ),
    (
        "code",
        """batches = ds.stream(paths["npy"], batch_size=2048, shuffle=True, seed=0, prefetch=4)
batches""",
    ),
    (
        "code",
        """seen, total = 0, 0.0
for batch in batches:  # one epoch; a training step would go here
    seen += len(batch)
    total += float(batch.sum(dtype="f8"))
seen == ds.open_source(paths["npy"]).shape[0], bool(np.isclose(total, float(ds.open(paths["npy"]).sum(dtype="f8").compute())))""",
    ),
    ("code", "import shutil\n\nshutil.rmtree(folder)"),
]


LABELLED = [
    (
        "markdown",
        """# Labelled data: names, units, coordinates and many files

Daily NetCDF-4 files of sea-surface temperature (packed as 16-bit integers, land left as fill values) and
wind speed, as an instrument pipeline writes them. `ds.open_dataset` gives the `xarray.Dataset` you know,
with each variable a dask array that daskstream planned: whole storage chunks, sized to the memory budget.""",
    ),
    (
        "code",
        """import os
import tempfile

import numpy as np
import pandas as pd
import xarray as xr

import daskstream as ds

folder = tempfile.mkdtemp(prefix="daskstream-labelled-")
lat, lon = np.linspace(-60, 60, 61), np.arange(0.0, 360.0, 2.0)
rng = np.random.default_rng(0)
paths = []
for day in range(1, 4):
    time = pd.date_range(f"2026-01-{day:02d}", periods=24, freq="h")
    sst = 20 - 15 * np.abs(np.sin(np.radians(lat)))[None, :, None] + rng.normal(0, 0.5, (24, 61, 180))
    sst[:, 20:30, 40:70] = np.nan  # a continent
    wind = rng.gamma(2.0, 3.0, (24, 61, 180)).astype("f4")
    day_data = xr.Dataset(
        {
            "sst": (("time", "lat", "lon"), sst, {"units": "degC", "long_name": "sea surface temperature"}),
            "wind": (("time", "lat", "lon"), wind, {"units": "m s-1"}),
        },
        coords={
            "time": time,
            "lat": ("lat", lat, {"units": "degrees_north"}),
            "lon": ("lon", lon, {"units": "degrees_east"}),
        },
        attrs={"title": "ocean sample"},
    )
    packed = {"dtype": "i2", "scale_factor": 0.001, "add_offset": 20.0, "_FillValue": -32767}
    chunked = {"chunksizes": (6, 61, 180), "zlib": True}
    paths.append(os.path.join(folder, f"day-{day}.nc"))
    day_data.to_netcdf(paths[-1], engine="h5netcdf", encoding={"sst": {**packed, **chunked}, "wind": chunked})
paths""",
    ),
    (
        "markdown",
        "## What a file holds\nGroups, variables, their storage chunks and filters, dimensions and attributes.",
    ),
    ("code", "ds.list(paths[0])"),
    (
        "markdown",
        "## The file as a Dataset\nDimensions, coordinates and units from the file; CF decoding (the packing, the "
        "fill values, the times) by xarray's own decoders, lazily; the chunks from daskstream's plan.",
    ),
    ("code", "sea = ds.open_dataset(paths[0])\nsea"),
    ("code", 'sea.sst.data.chunks, sea.sst.encoding["preferred_chunks"]'),
    (
        "markdown",
        "## Statistics that keep their labels\nReduce by dimension name; the result is a DataArray with the "
        "coordinates that remain and, where it is in the data's units, the units.",
    ),
    ("code", 'mean_sst = ds.reduce(sea.sst, "nanmean", axis="time").compute()  # lazy until computed\nmean_sst'),
    ("code", 'float(mean_sst.sel(lat=slice(-10, 10)).mean()), mean_sst.attrs["units"]'),
    (
        "markdown",
        "Exact quantiles (equal to `numpy.quantile`, computed out of core) and one-pass statistics, both labelled.",
    ),
    ("code", 'ds.reduce(sea.wind, "quantile", q=[0.05, 0.5, 0.95], axis=("lat", "lon"))'),
    ("code", 'wind_stats = ds.describe(sea.wind, axis="time").compute()\nwind_stats["std"]'),
    (
        "markdown",
        "## Many files as one\nA pattern opens the days in natural order and joins them along time, each file still "
        "read in its own storage chunks. xarray's own `open_mfdataset` takes the engine too.",
    ),
    ("code", 'week = ds.open_dataset(os.path.join(folder, "day-*.nc"))\nweek.sst'),
    ("code", 'xr.open_mfdataset(os.path.join(folder, "day-*.nc"), engine="daskstream", chunks={}).wind.data'),
    (
        "markdown",
        '## The same numbers as xarray\'s own reader\nThe Dataset equals what `engine="h5netcdf"` gives, value for '
        "value, and the labelled mean equals xarray's.",
    ),
    (
        "code",
        """theirs = xr.open_dataset(paths[0], engine="h5netcdf")
xr.testing.assert_identical(sea.load(), theirs.load())
xr.testing.assert_allclose(mean_sst, theirs.sst.mean("time"))
sea.identical(theirs), bool(np.allclose(wind_stats["mean"], theirs.wind.mean("time")))""",
    ),
    ("code", "import shutil\n\nshutil.rmtree(folder)"),
]

NOTEBOOKS = {"quickstart": QUICKSTART, "labelled": LABELLED}


def build(cells: list[tuple[str, str]]) -> object:
    """A notebook of ``cells`` (kind, text), not yet run."""
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for kind, text in cells:
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        notebook.cells.append(make(text))
    return notebook


def main(names: list[str]) -> None:
    import nbformat
    from nbclient import NotebookClient

    for name in names or list(NOTEBOOKS):
        notebook = build(NOTEBOOKS[name])
        NotebookClient(
            notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}
        ).execute()
        nbformat.write(notebook, HERE / f"{name}.ipynb")
        print(f"wrote {HERE / f'{name}.ipynb'}")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
