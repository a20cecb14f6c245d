"""Training-loop loaders side by side: ``StreamDataset`` against the PyTorch loaders people write by hand.

Each contender yields shuffled batches of ``--batch`` rows for one epoch over
the same file (warm page cache), through a ``torch.utils.data.DataLoader``:

* **StreamDataset**: ``DataLoader(StreamDataset(path, batch_size=B, shuffle=True), batch_size=None,
  num_workers=W)``, the documented setup;
* **BatchSampler loader**: a map-style dataset whose ``__getitem__`` takes a
  list of row indices and reads them (sorted) at once -- a memory map for
  ``.npy``, h5py fancy indexing for HDF5, ``zarr``'s ``oindex`` for Zarr --
  with ``sampler=BatchSampler(RandomSampler(...), B)``, ``batch_size=None``;
* **row Dataset**: the textbook map-style dataset, one row per ``__getitem__``
  (a memory map for ``.npy``, the h5py dataset or zarr array otherwise),
  ``DataLoader(batch_size=B, shuffle=True)``.

The hand-written loaders are stopped after ``--row-seconds`` and timed over
the rows they delivered by then: on compressed files they decode a chunk
for every few rows and would take hours per epoch.

Without a step, the figure is rows per second. With ``--step auto``, a
training step as long as one batch's read (the StreamDataset's time per
batch without a step) is simulated by sleeping; the figure is the share of
the epoch the loop spent waiting for batches (target: at most 5% for
StreamDataset).

    python -m benchmarks.loaders [--size 256MiB] [--only npy,hdf5-gzip,zarr-zstd] [--workers 2]
                                 [--batch 256] [--repeats 3] [--out benchmarks/results/loaders]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from dask.utils import format_bytes, parse_bytes

from benchmarks.samples import LAYOUTS, ensure


class RowsByIndices:
    """``dataset[indices]`` reads the rows (sorted: what memory maps, h5py and zarr read best)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.array: Any = None
        self.length = _open(where).shape[0]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, indices: list[int]) -> Any:
        import torch

        if self.array is None:  # opened in each worker, after the fork
            self.array = _open(self.where)
        chosen = np.sort(np.asarray(indices))
        rows = self.array.oindex[chosen] if hasattr(self.array, "oindex") else self.array[chosen]
        return torch.from_numpy(np.ascontiguousarray(rows))


class Rows(RowsByIndices):
    """``dataset[i]`` reads one row."""

    def __getitem__(self, index: int) -> Any:  # type: ignore[override]
        import torch

        if self.array is None:
            self.array = _open(self.where)
        return torch.from_numpy(np.array(self.array[index]))


def _open(where: str) -> Any:
    path, _, member = where.partition("::")
    if path.endswith(".npy"):
        return np.load(path, mmap_mode="r")
    if path.endswith(".h5"):
        import h5py

        return h5py.File(path, "r")[member]
    import zarr

    return zarr.open_group(path, mode="r")[member]


def loader_for(name: str, where: str, batch: int, workers: int) -> Any:
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    import daskstream as ds
    from daskstream.torch import StreamDataset

    persistent = workers > 0
    if name == "StreamDataset":
        dataset = StreamDataset(ds.open_source(where), batch_size=batch, shuffle=True)
        return DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=persistent)
    if name == "BatchSampler loader":
        dataset = RowsByIndices(where)
        sampler = BatchSampler(RandomSampler(range(len(dataset))), batch, drop_last=False)
        return DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=workers, persistent_workers=persistent)
    dataset = Rows(where)
    return DataLoader(
        dataset, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=persistent,
        collate_fn=torch.stack,
    )  # fmt: skip


def epoch(loader: Any, step: float, limit: float | None = None) -> tuple[int, float, float]:
    """Rows, seconds and seconds spent waiting for batches in one epoch (stopped after ``limit`` s)."""
    rows, waited = 0, 0.0
    start = time.perf_counter()
    iterator = iter(loader)
    while True:
        asked = time.perf_counter()
        batch = next(iterator, None)
        waited += time.perf_counter() - asked
        if batch is None:
            break
        rows += len(batch)
        if step:
            time.sleep(step)
        if limit is not None and time.perf_counter() - start > limit:
            break
    del iterator
    return rows, time.perf_counter() - start, waited


def measure(
    name: str, where: str, batch: int, workers: int, repeats: int, step: float, row_seconds: float
) -> dict[str, Any]:
    loader = loader_for(name, where, batch, workers)
    # The hand-written loaders re-read compressed chunks for every few rows: a partial epoch is timed.
    limit = None if name == "StreamDataset" else row_seconds
    epoch(loader, 0.0, limit)  # warms the page cache and starts persistent workers
    runs = [epoch(loader, step, limit) for _ in range(repeats)]
    rows, seconds, waited = (statistics.median(values) for values in zip(*runs, strict=True))
    return {
        "loader": name,
        "rows": int(rows),
        "seconds": seconds,
        "rows_per_second": rows / seconds,
        "step_seconds": step,
        "waited_seconds": waited,
        "waited_share": waited / seconds,
    }


CONTENDERS = ("StreamDataset", "BatchSampler loader", "row Dataset")


def run(keys: list[str], size: int, batch: int, workers: int, repeats: int, row_seconds: float) -> list[dict[str, Any]]:
    rows = []
    for key in keys:
        where = ensure(key, size)
        for step_mode in ("none", "auto"):
            step = 0.0
            if step_mode == "auto":
                # A step as long as StreamDataset's read of one batch, measured just before.
                plain = next(r for r in rows if r["layout_key"] == key and r["loader"] == "StreamDataset")
                step = batch / plain["rows_per_second"]
            for name in CONTENDERS:
                row = measure(name, where, batch, workers, repeats, step, row_seconds)
                row.update(layout=LAYOUTS[key].label, layout_key=key, workers=workers, batch=batch)
                rows.append(row)
                print(
                    f"{key} {name} step {step * 1e3:.1f} ms: {row['rows_per_second']:,.0f} rows/s, "
                    f"waited {100 * row['waited_share']:.1f}% of {row['seconds']:.2f} s"
                )
    return rows


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| layout | loader | rows/s, no step | vs BatchSampler | step per batch | loop waited, with step |",
        "|---|---|---:|---:|---:|---:|",
    ]
    plain = [r for r in rows if not r["step_seconds"]]
    for r in plain:
        sampler = next(
            o["rows_per_second"]
            for o in plain
            if o["layout_key"] == r["layout_key"] and o["loader"] == "BatchSampler loader"
        )
        stepped = next(
            o for o in rows if o["step_seconds"] and o["layout_key"] == r["layout_key"] and o["loader"] == r["loader"]
        )
        name = f"**{r['loader']}**" if r["loader"] == "StreamDataset" else r["loader"]
        lines.append(
            f"| {r['layout']} | {name} | {r['rows_per_second']:,.0f} | {r['rows_per_second'] / sampler:.2f} | "
            f"{1e3 * stepped['step_seconds']:.1f} ms | {100 * stepped['waited_share']:.1f}% |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--only", default="npy,hdf5-gzip,zarr-zstd")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--row-seconds", type=float, default=5.0, help="Time given to a hand-written loader per epoch.")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "loaders"))
    args = parser.parse_args(argv)
    size = int(parse_bytes(args.size))
    keys = [k for k in args.only.split(",") if k]
    rows = run(keys, size, args.batch, args.workers, args.repeats, args.row_seconds)
    header = (
        f"One shuffled epoch of {format_bytes(size)} float32 sources (4 KiB rows), warm page cache, batches of "
        f"{args.batch} rows, DataLoader with {args.workers} persistent workers, medians of {args.repeats} "
        f"(`python -m benchmarks.loaders --size {args.size} --only {args.only} --workers {args.workers}`)"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(markdown(rows, header))
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print(markdown(rows, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
