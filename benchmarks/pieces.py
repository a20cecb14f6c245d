"""Reductions read in pieces beside the same reductions with blocks read whole, and with the allocator left alone.

A reduction over a local chunked source reads each block a mebibyte of storage chunks at a time
(``daskstream.compute.chunkwise``), and a source's first read in a process has glibc keep 16 MiB free at the
top of each heap (``daskstream.compute.malloc-top-pad``), so a piece's temporaries reuse the pages the last
piece freed. This runs four computations over the peers' 1 GiB float32 field (Zarr, zstd 3, written by
``benchmarks.peers``; chunks of 1024 x 1024, or ``--chunk`` x ``--chunk``):

===================  ================================================================================
sum                  ``x.sum(dtype="f8")``
mean std max         ``dask.compute(x.mean(), x.std(), x.max())``: computed together, each piece read once
std along 0          ``x.std(axis=0)``: partials as wide as the kept axis
std, storage blocks  ``x.std()`` of ``ds.open(path, chunks="storage")``: blocks of one storage chunk each
===================  ================================================================================

each in three settings: **pieces** (the defaults), **pieces, allocator left alone**
(``malloc-top-pad: none``), **blocks whole** (``chunkwise: false``); blocks of one storage chunk are read
whole in all three (a block is one piece at most). Every run is a fresh interpreter that
opens the array untimed and times its first computation, the way a script runs one (settings interleaved
within each round). Reported: the medians of the wall time, the process's CPU time and its minor page faults
(pages faulted in afresh) during the computation.

Run ``python -m benchmarks.pieces [--size 1GiB] [--chunk 1024] [--format zarr3-zstd] [--repeats 5]
[--scheduler threads|synchronous] [--data-dir benchmarks/data] [--out benchmarks/results/pieces]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import peers
from benchmarks.timing import marked_report, run_fresh, write_results

COMPUTATIONS = ("sum", "mean std max", "std along 0", "std, storage blocks")
SETTINGS: dict[str, dict[str, Any]] = {
    "pieces": {},
    "pieces, allocator left alone": {"daskstream.compute.malloc-top-pad": "none"},
    "blocks whole": {"daskstream.compute.chunkwise": False},
}
RESULT_MARK = "RESULT "


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One computation's first run in this (fresh) interpreter: wall, CPU and minor faults."""
    import dask

    import daskstream as ds

    x = ds.open(spec["path"], chunks="storage" if spec["computation"] == "std, storage blocks" else "auto")
    work = {
        "sum": lambda: x.sum(dtype="f8").compute(),
        "mean std max": lambda: dask.compute(x.mean(), x.std(), x.max()),
        "std along 0": lambda: x.std(axis=0).compute(),
        "std, storage blocks": lambda: x.std().compute(),
    }[spec["computation"]]
    with dask.config.set({**SETTINGS[spec["setting"]], "scheduler": spec.get("scheduler", "threads")}):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        work()
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"seconds": wall, "cpu_seconds": cpu, "minor_faults": after.ru_minflt - before.ru_minflt}


def _launch(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    done = run_fresh("benchmarks.pieces", spec, timeout)
    report = marked_report(done.stdout, RESULT_MARK)
    if done.returncode != 0 or report is None:
        raise RuntimeError(f"{spec['computation']} ({spec['setting']}) failed: {done.stderr.strip()[-500:]}")
    return dict(report)


def table(rows: list[dict[str, Any]], header: str) -> str:
    out = [
        header,
        "",
        "| computation | setting | s | CPU s | minor page faults | vs pieces |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for computation in COMPUTATIONS:
        mine = [r for r in rows if r["computation"] == computation]
        base = next(r["seconds"] for r in mine if r["setting"] == "pieces")
        for r in mine:
            out.append(
                f"| {computation} | {r['setting']} | {r['seconds']:.3f} | {r['cpu_seconds']:.3f} | "
                f"{r['minor_faults']:,} | {r['seconds'] / base:.2f}x |"
            )
    out += ["", "vs pieces: the setting's median wall time over that of pieces (above 1: pieces faster)."]
    return "\n".join(out) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1GiB", help="The field's size (default 1GiB).")
    parser.add_argument("--chunk", type=int, default=1024, help="Storage chunks' side (default 1024: 4 MiB).")
    parser.add_argument("--format", default="zarr3-zstd", choices=("zarr2-zstd", "zarr3-zstd"))
    parser.add_argument("--repeats", type=int, default=5, help="Rounds, each setting once per round (default 5).")
    parser.add_argument(
        "--scheduler",
        default="threads",
        choices=("threads", "synchronous"),
        help="dask's scheduler (default threads, one per CPU; synchronous: one thread).",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="Seconds one run may take.")
    parser.add_argument("--data-dir", type=Path, default=Path("benchmarks/data"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/pieces"))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        print(RESULT_MARK + json.dumps(run_one(json.loads(args.one))), flush=True)
        return 0
    from daskstream.planning.budget import parse_budget

    peers.CHUNK_SIDE, peers.CHUNK = args.chunk, (args.chunk, args.chunk)  # the peers' data set in these chunks
    rows = peers.field_rows(parse_budget(args.size))
    path = peers.ensure_field(peers.FORMATS[args.format], rows, args.data_dir, lambda s: print(s, file=sys.stderr))
    peers.warm(path)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for round_number in range(args.repeats):
        for computation in COMPUTATIONS:
            for setting in SETTINGS:
                spec = {"path": str(path), "computation": computation, "setting": setting, "scheduler": args.scheduler}
                got = _launch(spec, args.timeout)
                runs.setdefault((computation, setting), []).append(got)
                print(
                    f"[{round_number + 1}/{args.repeats}] {computation}, {setting}: {got['seconds']:.3f} s",
                    file=sys.stderr,
                )
    rows_out = [
        {
            "computation": computation,
            "setting": setting,
            "runs": got,
            **{key: statistics.median(r[key] for r in got) for key in ("seconds", "cpu_seconds", "minor_faults")},
        }
        for (computation, setting), got in runs.items()
    ]
    chunk_mib = args.chunk * args.chunk * 4 / 2**20
    header = (
        f"`python -m benchmarks.pieces --size {args.size} --chunk {args.chunk} --format {args.format} "
        f"--repeats {args.repeats} --scheduler {args.scheduler}`\n\n{peers.FORMATS[args.format].label}, {rows} x {peers.COLS} float32, storage "
        f"chunks of {chunk_mib:g} MiB; {os.cpu_count()} CPUs, dask's {args.scheduler} scheduler; medians of {args.repeats} "
        "runs, each a fresh interpreter timing its first computation, settings interleaved."
    )
    text = table(rows_out, header)
    document = {"args": vars(args) | {"out": str(args.out), "data_dir": str(args.data_dir)}, "rows": rows_out}
    write_results(str(args.out), text.rstrip("\n"), document)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
