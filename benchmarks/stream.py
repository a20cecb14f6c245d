"""Streaming: a bare pass against ``ds.open(...).sum()``, and how well reading overlaps a busy consumer.

For each layout (``benchmarks.samples``), warm page cache, medians of ``--repeats``:

* **bare pass**: ``for batch in ds.stream(path): pass`` against a full sum of
  the same file; target: the stream's throughput within 15% of the sum's;
* **overlap**: a consumer that sleeps, per batch, as long as reading one batch
  takes (the bare pass's time per batch); with reading in the background the
  pass should take close to the longer of the two totals, not their sum;
  target: at most 1.25 x max(read, consume).

    python -m benchmarks.stream [--size 1GiB] [--only npy,hdf5-gzip,zarr-zstd] [--repeats 3]
                                [--out benchmarks/results/stream]
"""

from __future__ import annotations

import argparse
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
        f"prefetch {prefetch}, default batches (one block) "
        f"(`python -m benchmarks.stream --size {args.size} --only {args.only}`)"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(markdown(rows, header))
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print(markdown(rows, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
