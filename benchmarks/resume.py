"""Resuming a training stream mid-epoch: time to the first batch after a restart, against replaying to it.

A training job restarted from a checkpoint needs the batch it stopped at.
For each layout (``--only``, :mod:`benchmarks.samples`, ``--size``), order
(shuffled and in order) and way of keeping the position:

* **Stream.state_dict**: ``ds.stream(path, batch_size=B, shuffle=s, seed=0)``
  iterated in the training process; its ``state_dict()`` kept as JSON;
* **StatefulDataLoader**: torchdata's ``StatefulDataLoader(StreamDataset(path,
  batch_size=B, shuffle=s, seed=0), batch_size=None, num_workers=W)``; its
  ``state_dict()`` (every worker's position) kept with ``torch.save``
  (``set_epoch(0)`` first, as a training loop calls it);

each in a fresh interpreter (imports not timed):

1. **save**: the loader takes ``--at`` of the epoch's batches, saves its
   state, and notes a digest of the batch it takes next;
2. **resume**: the time from building the loader and loading the state to
   the first batch in hand;
3. **replay**, what a loader without a saved position does: the time from
   building the loader to that same batch, iterating and discarding the
   batches before it from the epoch's start;
4. **fresh start** (a reference): the time from building the loader to the
   epoch's first batch.

The resumed and replayed batches must have the saved batch's digest.
Resume, replay and fresh start run interleaved for ``--repeats`` rounds
after the file is read once (warm page cache); the table gives medians and
resume / replay (target: at most 0.1 on a 1 GiB array).

    python -m benchmarks.resume [--size 1GiB] [--only npy,zarr-zstd] [--batch 256] [--workers 2] [--at 0.5]
                                [--repeats 3] [--out benchmarks/results/resume]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dask.utils import format_bytes, parse_bytes

from benchmarks.loaders import RESULT, ChildFailed, in_child, warm

WAYS = ("Stream.state_dict", "StatefulDataLoader")
ORDERS = ("shuffled", "in order")
STEPS = ("resume", "replay", "fresh start")


def _loader(way: str, where: str, shuffled: bool, batch: int, workers: int) -> Any:
    """The loader of ``way``, over the same stream (seed 0, so a restarted job shuffles alike)."""
    if way == "Stream.state_dict":
        import daskstream as ds

        return ds.stream(where, batch_size=batch, shuffle=shuffled, seed=0)
    from torchdata.stateful_dataloader import StatefulDataLoader

    from daskstream.torch import StreamDataset

    dataset = StreamDataset(where, batch_size=batch, shuffle=shuffled, seed=0)
    # As a training loop does: without it, workers started afresh take their order from the DataLoader's seed,
    # which differs between processes, and a replay would not reach the saved run's batches.
    dataset.set_epoch(0)
    return StatefulDataLoader(dataset, batch_size=None, num_workers=workers)


def _digest(batch: Any) -> str:
    array = batch.numpy() if hasattr(batch, "numpy") else batch
    return hashlib.sha1(array.tobytes()).hexdigest()


def _save_state(way: str, state: dict[str, Any], path: str) -> None:
    if way == "Stream.state_dict":
        Path(path).write_text(json.dumps(state))
    else:
        import torch

        torch.save(state, path)


def _load_state(way: str, path: str) -> dict[str, Any]:
    if way == "Stream.state_dict":
        return json.loads(Path(path).read_text())
    import torch

    return torch.load(path, weights_only=False)


def child(task: dict[str, Any]) -> dict[str, Any]:
    """One step (``save``, ``resume``, ``replay`` or ``fresh start``) of one way, in this fresh interpreter."""
    # Imported before the timer: what is timed is the loader, not the interpreter's start.
    modules = ["daskstream"]
    if task["way"] == "StatefulDataLoader":
        modules += ["torch", "torchdata.stateful_dataloader", "daskstream.torch"]
    for module in modules:
        importlib.import_module(module)
    way, step, at = task["way"], task["step"], task["at"]
    arguments = (way, task["where"], task["shuffled"], task["batch"], task["workers"])
    start = time.perf_counter()
    loader = _loader(*arguments)
    if step == "save":
        batches = iter(loader)
        for _ in range(at):
            next(batches)
        _save_state(way, loader.state_dict(), task["state"])
        return {"digest": _digest(next(batches))}
    if step == "resume":
        loader.load_state_dict(_load_state(way, task["state"]))
        batches = iter(loader)
    else:
        batches = iter(loader)
        for _ in range(at if step == "replay" else 0):
            next(batches)
    batch = next(batches)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "digest": _digest(batch)}


def run(
    keys: list[str], size: int, batch: int, workers: int, at: float, repeats: int, scratch: str
) -> list[dict[str, Any]]:
    """A row per (layout, order, way): the medians of resume, replay and fresh start, and whether batches matched."""
    import daskstream as ds
    from benchmarks.samples import LAYOUTS, ensure

    rows = []
    for key in keys:
        where = ensure(key, size)
        warm(where)
        cases = []
        for order in ORDERS:
            for way in WAYS:
                task = {"way": way, "where": where, "shuffled": order == "shuffled", "batch": batch,
                        "workers": workers, "state": os.path.join(scratch, f"{key}-{order}-{way}.state")}  # fmt: skip
                # Batches a rank yields in an epoch: the stream's count, with or without loader workers.
                total = len(ds.stream(where, batch_size=batch, shuffle=order == "shuffled", seed=0))
                task["at"] = int(total * at)
                try:
                    saved = in_child(["--child", json.dumps({**task, "step": "save"})], module="benchmarks.resume")
                except ChildFailed as failed:
                    rows.append({"layout": LAYOUTS[key].label, "order": order, "way": way, "error": str(failed)})
                    continue
                cases.append((order, way, task, total, saved["digest"]))
        times: dict[tuple[str, str, str], list[float]] = {}
        matched: dict[tuple[str, str, str], bool] = {}  # (order, way, step): every run's batch was the saved one
        for round_ in range(repeats):
            for order, way, task, _, digest in cases:
                for step in STEPS if round_ % 2 == 0 else STEPS[::-1]:
                    try:
                        got = in_child(["--child", json.dumps({**task, "step": step})], 600, module="benchmarks.resume")
                    except ChildFailed as failed:
                        got = {"seconds": float("nan"), "digest": f"failed: {failed}"}
                    times.setdefault((order, way, step), []).append(got["seconds"])
                    if step != "fresh start":
                        ok = got["digest"] == digest
                        matched[order, way, step] = matched.get((order, way, step), True) and ok
                    print(f"{key} {order} {way} {step}: {got['seconds']:.3f} s", file=sys.stderr)
        for order, way, task, total, _ in cases:
            median = {step: statistics.median(times[order, way, step]) for step in STEPS}
            rows.append(
                {
                    "layout": LAYOUTS[key].label,
                    "layout_key": key,
                    "bytes": size,
                    "order": order,
                    "way": way,
                    "workers": workers if way == "StatefulDataLoader" else 0,
                    "batches": total,
                    "at": task["at"],
                    "resume_seconds": median["resume"],
                    "replay_seconds": median["replay"],
                    "fresh_start_seconds": median["fresh start"],
                    "ratio": median["resume"] / median["replay"],
                    "same_batch": {step: matched[order, way, step] for step in ("resume", "replay")},
                    "runs": {step: times[order, way, step] for step in STEPS},
                }
            )
    return rows


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| layout | order | position kept by | batch resumed at | resume: to the first batch | replay to it | "
        "resume / replay | fresh start: to the epoch's first batch | the saved run's next batch? resumed, replayed |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['layout']} | {r['order']} | {r['way']} | failed: {r['error']} | | | | | |")
            continue
        way = f"{r['way']} ({r['workers']} workers)" if r["way"] == "StatefulDataLoader" else r["way"]
        lines.append(
            f"| {r['layout']} | {r['order']} | {way} | {r['at']:,} of {r['batches']:,} | {r['resume_seconds']:.3f} s | "
            f"{r['replay_seconds']:.3f} s | **{r['ratio']:.3f}** | {r['fresh_start_seconds']:.3f} s | "
            f"{', '.join('yes' if same else '**no**' for same in r['same_batch'].values())} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--only", default="npy,zarr-zstd")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2, help="StatefulDataLoader's workers.")
    parser.add_argument("--at", type=float, default=0.5, help="Where in the epoch the state is saved (0 to 1).")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "resume"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(RESULT + json.dumps(child(json.loads(args.child))), flush=True)
        # Without waiting for loader workers to wind down: the result is out.
        os._exit(0)
    size = int(parse_bytes(args.size))
    keys = [k for k in args.only.split(",") if k]
    with tempfile.TemporaryDirectory() as scratch:
        rows = run(keys, size, args.batch, args.workers, args.at, args.repeats, scratch)
    command = "python -m benchmarks.resume " + " ".join(argv if argv is not None else sys.argv[1:])
    header = (
        f"`{command.strip()}`\n\nResuming an epoch of {format_bytes(size)} float32 sources (4 KiB rows, batches of "
        f"{args.batch}) at {args.at:.0%} of it after a restart, warm page cache, each step in a fresh interpreter "
        f"(imports not timed), medians of {args.repeats} interleaved rounds. Target: resume / replay at most 0.1."
    )
    text = markdown(rows, header)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
