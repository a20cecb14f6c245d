"""Streaming: a bare pass against ``ds.open(...).sum()``, and how well reading overlaps a busy consumer.

For each layout (``benchmarks.samples``), warm page cache, medians of ``--repeats``:

* **bare pass**: ``for batch in ds.stream(path): pass`` against a full sum of
  the same file; target: the stream's throughput within 15% of the sum's;
* **overlap**: a consumer that sleeps, per batch, as long as reading one batch
  takes (the bare pass's time per batch); with reading in the background the
  pass should take close to the longer of the two totals, not their sum;
  target: at most 1.25 x max(read, consume).
* **shuffled, with a training step** (``--step-size``, 256-row batches):
  three epochs of a shuffled stream with a step per batch as long as a
  batch's read (an in-order pass's time per batch), as a shuffled pass's
  time per batch, and of 5 ms; the share of each epoch
  the loop waited for batches, first epoch and the later ones; target: at
  most 5%.
* **loaders** (with PyTorch installed): :mod:`benchmarks.loaders`, the
  StreamDataset against hand-written DataLoader datasets.

    python -m benchmarks.stream [--size 1GiB] [--step-size 256MiB] [--only npy,hdf5-gzip,zarr-zstd]
                                [--repeats 3] [--no-loaders] [--out benchmarks/results/stream]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

from dask.utils import format_bytes, parse_bytes

import daskstream as ds
from benchmarks.samples import LAYOUTS, ensure
from benchmarks.timing import clocked, warm_median


def measure(key: str, where: str, repeats: int, prefetch: Any) -> dict[str, Any]:
    nbytes = ds.open_source(where).nbytes
    batches = len(ds.stream(where))

    def bare() -> None:
        for _ in ds.stream(where, prefetch=prefetch):
            pass

    summed = warm_median(lambda: clocked(lambda: ds.open(where).sum().compute()), repeats)
    read = warm_median(lambda: clocked(bare), repeats)
    per_batch = read / batches

    def busy() -> None:
        for _ in ds.stream(where, prefetch=prefetch):
            time.sleep(per_batch)

    overlapped = warm_median(lambda: clocked(busy), repeats)
    consume = per_batch * batches
    return {
        "layout": LAYOUTS[key].label,
        "bytes": nbytes,
        "batches": batches,
        "prefetch": prefetch,
        "sum_seconds": summed,
        "stream_seconds": read,
        "stream_vs_sum": summed / read,
        "consume_seconds": consume,
        "overlapped_seconds": overlapped,
        "overlap_ratio": overlapped / max(read, consume),
        "serial_ratio": (read + consume) / max(read, consume),
    }


def waits(key: str, where: str, batch: int = 256, epochs: int = 3) -> list[dict[str, Any]]:
    """Shares of each epoch a loop with a training step waited for a shuffled stream's batches."""
    s = ds.stream(where, batch_size=batch, shuffle=True, seed=0)
    in_order = ds.stream(where, batch_size=batch)
    # A batch's read: an in-order pass (reads, no gathering) per batch; and a shuffled pass per batch.
    read = warm_median(lambda: clocked(lambda: sum(1 for _ in in_order)), 3) / len(in_order)
    shuffled = warm_median(lambda: clocked(lambda: sum(1 for _ in s)), 3) / len(s)
    rows = []
    for step, what in ((read, "a batch's read"), (shuffled, "a shuffled pass per batch"), (0.005, "5 ms")):
        shares = []
        for _ in range(epochs):
            waited, start = 0.0, time.perf_counter()
            batches = iter(s)
            while True:
                asked = time.perf_counter()
                item = next(batches, None)
                waited += time.perf_counter() - asked
                if item is None:
                    break
                time.sleep(step)
            shares.append(waited / (time.perf_counter() - start))
        rows.append(
            {"layout": LAYOUTS[key].label, "batches": len(s), "step_seconds": step, "step": what, "first_epoch": shares[0],
             "later_epochs": max(shares[1:]), "shards": len(s.block_bounds), "shuffle_blocks": s.shuffle_blocks}
        )  # fmt: skip
        print(f"{key}: step {step * 1e3:.2f} ms, waited {100 * shares[0]:.1f}% then {100 * max(shares[1:]):.1f}%")
    return rows


def waits_markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| layout | batches | step per batch, as long as | loop waited, first epoch | later epochs (largest) |",
        "|---|---:|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['layout']} | {r['batches']} | {1e3 * r['step_seconds']:.2f} ms, {r['step']} | "
            f"{100 * r['first_epoch']:.1f}% | "
            f"**{100 * r['later_epochs']:.1f}%** |"
        )
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| layout | batches | sum | bare stream pass | stream / sum throughput | consumer busy as long as reads "
        "| pass with that consumer | / max(read, consume) | without overlap it would be |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['layout']} | {r['batches']} | {r['sum_seconds']:.2f} s | {r['stream_seconds']:.2f} s | "
            f"**{r['stream_vs_sum']:.2f}** | {r['consume_seconds']:.2f} s | {r['overlapped_seconds']:.2f} s | "
            f"**{r['overlap_ratio']:.2f}** | {r['serial_ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--only", default="npy,hdf5-gzip,zarr-zstd")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prefetch", default="2", help='Batches read ahead, or "auto".')
    parser.add_argument("--step-size", default="256MiB", help="Size of the sources of the step and loader tables.")
    parser.add_argument("--no-loaders", action="store_true", help="Leave out the DataLoader table.")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "stream"))
    args = parser.parse_args(argv)
    prefetch = args.prefetch if args.prefetch == "auto" else int(args.prefetch)
    size = int(parse_bytes(args.size))
    rows = []
    for key in filter(None, args.only.split(",")):
        row = measure(key, ensure(key, size), args.repeats, prefetch)
        print(
            f"{key}: stream {row['stream_seconds']:.2f} s vs sum {row['sum_seconds']:.2f} s "
            f"({row['stream_vs_sum']:.2f}); with a busy consumer {row['overlapped_seconds']:.2f} s = "
            f"{row['overlap_ratio']:.2f} x max(read, consume)"
        )
        rows.append(row)
    threads = ds.stream(ensure(args.only.split(",")[0], size)).threads
    header = (
        f"Streaming {format_bytes(size)} float32 sources, warm page cache, {threads} reading threads, "
        f"prefetch {prefetch}, default batches (one shard) "
        f"(`python -m benchmarks.stream --size {args.size} --only {args.only}`)"
    )
    keys = [k for k in args.only.split(",") if k]
    step_size = int(parse_bytes(args.step_size))
    waited = [row for key in keys for row in waits(key, ensure(key, step_size))]
    text = (
        markdown(rows, header)
        + "\n"
        + waits_markdown(
            waited,
            f"A training loop over a shuffled stream of {format_bytes(step_size)} sources, 256-row batches, a step per "
            "batch as long as a batch's read (an in-order pass per batch), as a shuffled pass per batch, and of 5 ms: "
            f"share of each of three epochs spent waiting for a batch (`python -m benchmarks.stream --step-size {args.step_size} --only {args.only}`)",
        )
    )
    loaders: list[dict[str, Any]] = []
    if not args.no_loaders and importlib.util.find_spec("torch") is not None:
        from benchmarks import loaders as contenders

        loaders = contenders.run(keys, step_size, 256, 2, args.repeats, 5.0)
        text += "\n" + contenders.markdown(
            loaders,
            f"One shuffled epoch of {format_bytes(step_size)} sources through a PyTorch DataLoader with 2 persistent "
            f"workers, 256-row batches, medians of {args.repeats} (`python -m benchmarks.loaders --size "
            f"{args.step_size} --only {args.only}`; hand-written loaders timed over their first 5 s)",
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"bare": rows, "waits": waited, "loaders": loaders}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
