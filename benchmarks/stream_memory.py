"""What a stream holds at its worst, against what it projects (``Stream.projected_peak_bytes``).

Each case runs in a fresh interpreter: a stream over one of the benchmark
data sets (:mod:`benchmarks.samples`) and a training loop at its worst for
memory -- it first takes batches as fast as they come, so that the stream,
found waiting, adds every read ahead its budget allows, then steps slowly
enough that every read ahead, shuffle window and queued batch fills up; it
steps slowly again over the epoch's last batches and the next epoch's first
ones, while the stream reads the next epoch's first shards. Two peaks are
taken over the whole epoch and the turn to the next:

* **traced**: what Python and numpy allocate (``tracemalloc``), the memory
  the stream's objects hold;
* **resident**: the process's peak resident size (``VmHWM``, reset before the
  epoch) less its size before it, which adds what the C allocator keeps.

Each is given as a share of the projection (the traced one of the projection
less its "allocator reserve" term, which no Python object holds). The
target: the resident peak within 5% of the projection, never above it.

    python -m benchmarks.stream_memory [--size 512MiB] [--only npy,hdf5-gzip,zarr-zstd]
                                       [--budgets 64MiB,256MiB] [--batches 64,1024]
                                       [--out benchmarks/results/stream-memory]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from dask.utils import format_bytes, parse_bytes

from benchmarks.samples import LAYOUTS, ensure
from benchmarks.timing import write_results

# The measuring child: argv = where, shuffle (0/1), batch rows, budget; prints one JSON line.
CHILD = r"""
import gc, json, math, sys, time, tracemalloc
import daskstream as ds

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))

where, shuffle, batch, budget = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4]
s = ds.stream(where, batch_size=batch, shuffle=shuffle, seed=0, memory_budget=budget)
# Batches to one window (shuffling) or one read (in order): the stream is found waiting about once per window.
per = math.ceil((s.shuffle_blocks if shuffle else 1) * s.read_rows / batch)
fast = min(len(s) // 2, 2 * (s.extra_reads + 2) * per)
slow = 3 * per + 20
# Slower than any read here: a batch's bytes at 50 MB/s.
step = batch * s.item_bytes / 50e6
gc.collect()
tracemalloc.start()
traced_start = tracemalloc.get_traced_memory()[0]
resident_start = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM to the present size
# Slowly over the first windows once the reads ahead have grown, then fast, then slowly again across
# the turn of the epoch, while the next epoch's first reads are begun, and into the next epoch.
for n, batch_held in enumerate(s):
    if fast < n <= fast + slow or n >= len(s) - slow:
        time.sleep(step)
for n, batch_held in enumerate(s):
    time.sleep(step)
    if n > slow:
        break
traced = tracemalloc.get_traced_memory()[1] - traced_start
resident = status("VmHWM:") - resident_start
print(json.dumps({
    "projected": s.projected_peak_bytes, "terms": s.memory_terms, "traced": traced, "resident": resident,
    "read_bytes": s.read_rows * s.item_bytes, "extra_reads": s.extra_reads, "batch_bytes": batch * s.item_bytes,
}))
"""


def measure(where: str, shuffle: bool, batch: int, budget: str) -> dict[str, Any] | None:
    """The case's figures, or ``None`` where the stream refuses the budget (a MemoryBudgetError)."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, where, str(int(shuffle)), str(batch), budget], capture_output=True, text=True
    )
    if done.returncode and "MemoryBudgetError" in done.stderr:
        return None
    done.check_returncode()
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["traced_share"] = row["traced"] / (row["projected"] - row["terms"]["allocator reserve"])
    row["resident_share"] = row["resident"] / row["projected"]
    return row


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| layout | order | budget | batch | read | projected | traced peak (share) | resident peak (share) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['layout']} | {'shuffled' if r['shuffle'] else 'in order'} | {r['budget']} | "
            f"{format_bytes(r['batch_bytes'])} | {format_bytes(r['read_bytes'])} | {format_bytes(r['projected'])} | "
            f"{format_bytes(r['traced'])} ({r['traced_share']:.2f}) | "
            f"{format_bytes(r['resident'])} ({r['resident_share']:.2f}) |"
        )
    shares = [r["resident_share"] for r in rows]
    lines += ["", f"Resident peak / projection: {min(shares):.2f} to {max(shares):.2f}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="512MiB")
    parser.add_argument("--only", default="npy,hdf5-gzip,zarr-zstd")
    parser.add_argument("--budgets", default="64MiB,256MiB")
    parser.add_argument("--batches", default="64,1024", help="Batch sizes in rows (4 KiB each).")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "stream-memory"))
    args = parser.parse_args(argv)
    size = int(parse_bytes(args.size))
    rows = []
    for key in [k for k in args.only.split(",") if k]:
        where = ensure(key, size)
        for shuffle in (False, True):
            for budget in args.budgets.split(","):
                for batch in map(int, args.batches.split(",")):
                    row = measure(where, shuffle, batch, budget)
                    if row is None:
                        print(f"{key} {budget} batch {batch}: refused (over the budget)", flush=True)
                        continue
                    row.update(layout=LAYOUTS[key].label, shuffle=shuffle, budget=budget, batch=batch)
                    rows.append(row)
                    print(
                        f"{key} {'shuffled' if shuffle else 'in order'} {budget} batch {batch}: projected "
                        f"{format_bytes(row['projected'])}, traced {row['traced_share']:.2f}, "
                        f"resident {row['resident_share']:.2f}",
                        flush=True,
                    )
    header = (
        f"A stream's worst case for memory against its projection: {format_bytes(size)} float32 sources, a loop "
        "that first takes batches as fast as they come, then slowly; fresh interpreter per case "
        f"(`python -m benchmarks.stream_memory --size {args.size} --only {args.only}`)"
    )
    table = markdown(rows, header)
    write_results(args.out, table, rows)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
