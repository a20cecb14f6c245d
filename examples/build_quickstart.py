"""Write ``quickstart.ipynb`` from the cells below, run it top to bottom, and save it with its outputs.

    python examples/build_quickstart.py

Edit the cells here, not the notebook, so the two never drift apart; the
test suite runs the saved notebook again and fails on any error.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

CELLS = [
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
    ("markdown", "## One pass of statistics\nCount, NaN count, mean, standard deviation, minimum and maximum."),
    (
        "code",
        """x = ds.open(paths["zarr"])
with ds.session("threads") as s:  # a progress bar shows for computations longer than half a second
    stats = s.compute(ds.describe(x))
stats""",
    ),
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


def build() -> object:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for kind, text in CELLS:
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        notebook.cells.append(make(text))
    return notebook


def main() -> None:
    import nbformat
    from nbclient import NotebookClient

    notebook = build()
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    nbformat.write(notebook, HERE / "quickstart.ipynb")
    print(f"wrote {HERE / 'quickstart.ipynb'}")


if __name__ == "__main__":
    main()
