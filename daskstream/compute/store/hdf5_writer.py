"""The one writer of an HDF5 target: blocks computed on the active scheduler, written by this process in batches."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import TYPE_CHECKING, Any

import dask
import dask.array as da
import numpy as np
from dask.optimization import cull

from daskstream.compute.store.hdf5_encoder import hdf5_encoder_for
from daskstream.compute.store.record import H5_DONE_ATTR, block_name
from daskstream.compute.store.target import ProgressCallback
from daskstream.errors import TargetWriteError
from daskstream.graph.optimize import with_aggregates_computed
from daskstream.planning.grid import regular_block_slices
from daskstream.runtime.pools import one_process_pool
from daskstream.runtime.schedulers import active_client, active_get

if TYPE_CHECKING:
    from daskstream.compute.store.hdf5_target import Hdf5Target

# What h5py raises when HDF5 cannot write: OSError mostly, RuntimeError from flush and close.
H5_WRITE_ERRORS = (OSError, RuntimeError)


def flat_index(index: tuple[int, ...], numblocks: tuple[int, ...]) -> int:
    return int(np.ravel_multi_index(index, numblocks)) if numblocks else 0


class Hdf5Writer:
    """The one writer of an HDF5 target: blocks come in computed, go out written and recorded."""

    def __init__(
        self,
        target: Hdf5Target,
        h5file: Any,
        dset: Any,
        x: da.Array,
        done: np.ndarray,
        total: int,
        report: ProgressCallback | None,
    ) -> None:
        self.target, self.h5file, self.dset, self.x = target, h5file, dset, x
        self.done, self.total, self.report = done, total, report
        self.unrecorded: list[tuple[int, ...]] = []
        self.count = int(done.sum())
        # Aggregates that later passes take (a mean to centre with) are computed once, not per batch.
        x = self.x = with_aggregates_computed(x, target.resources)
        # Where the tasks can encode the chunks (see hdf5_encoder), they return the bytes to put in place.
        self.encoder = hdf5_encoder_for(dset) if dask.config.get("daskstream.compute.encode-in-tasks", True) else None
        computed = self.encoder.encoded_blocks(x) if self.encoder is not None else x
        self.computed_name = computed.name
        # One graph for all blocks, optimized once (as x.to_delayed(optimize_graph=True) does); each
        # batch sends the scheduler only the tasks its blocks need, found by walking back from them.
        # Building one Delayed per block and merging them with dask.compute costs batch² per batch.
        keys = computed.__dask_keys__()
        self.graph: dict[Any, Any] = dict(computed.__dask_optimize__(computed.__dask_graph__(), keys))

    def _key(self, index: tuple[int, ...]) -> tuple:
        return (self.computed_name, *index)

    def _subgraph(self, keys: Sequence[Any]) -> dict[Any, Any]:
        """The tasks ``keys`` need: dask's cull walks back from them, in proportion to them, not to the graph."""
        return cull(self.graph, list(keys))[0]

    def run(self, pending: list[tuple[int, ...]]) -> None:
        window = self.target.window(self.x)
        client = active_client()
        try:
            if client is not None:
                self._run_distributed(client, pending, window)
            else:
                self._run_local(pending, window)
        except BaseException:
            # Blocks written before the failure are kept: record them if the file still takes it.
            with contextlib.suppress(TargetWriteError):
                self._record()
            raise
        self._record()

    def _run_local(self, pending: list[tuple[int, ...]], window: int) -> None:
        # What dask.compute(x) would use: the configured scheduler, else the threaded one.
        schedule = active_get([self.x])
        if schedule is None:  # arrays always have a default scheduler; this says so to the type checker
            raise RuntimeError("dask has no scheduler for this array")
        with one_process_pool():
            self._run_batches(pending, window, schedule)

    def _run_batches(self, pending: list[tuple[int, ...]], window: int, schedule: Callable[..., Any]) -> None:
        batches = batched(pending, window)

        def compute(batch: Sequence[tuple[int, ...]]) -> tuple[Sequence[tuple[int, ...]], Sequence[Any]]:
            keys = [self._key(index) for index in batch]
            return batch, schedule(self._subgraph(keys), keys)

        # The next batch computes while this one is written: at most two batches in memory.
        with ThreadPoolExecutor(1, thread_name_prefix="daskstream-store") as pool:
            first = next(batches, None)
            running = pool.submit(compute, first) if first else None
            while running is not None:
                batch, results = running.result()
                following = next(batches, None)
                running = pool.submit(compute, following) if following else None
                for index, block in zip(batch, results):
                    self._write(index, block)
                del results
                self._record()

    def _run_distributed(self, client: Any, pending: list[tuple[int, ...]], window: int) -> None:
        from distributed import as_completed

        queue = iter(pending)
        in_flight: dict[Any, tuple[int, ...]] = {}
        finished = as_completed()

        def submit(n: int) -> None:
            batch = list(islice(queue, n))
            if batch:
                keys = [self._key(index) for index in batch]
                for future, index in zip(client.get(self._subgraph(keys), keys, sync=False), batch):
                    in_flight[future] = index
                    finished.add(future)

        # Top up in groups rather than one by one: each submission sends a graph to the scheduler.
        refill = max(1, window // 2)
        submit(window)
        try:
            for future in finished:
                index = in_flight.pop(future)
                block = future.result()
                future.release()
                self._write(index, block)
                del block
                if len(self.unrecorded) >= refill or not in_flight:
                    self._record()
                if window - len(in_flight) >= refill:
                    submit(window - len(in_flight))
        except BaseException:
            client.cancel(list(in_flight))
            raise

    def _write(self, index: tuple[int, ...], block: np.ndarray) -> None:
        region = regular_block_slices(self.x.chunks, index)
        try:
            if self.encoder is not None:
                # The chunk's bytes, encoded by the task: put in place as they are.
                offset = tuple(s.start for s in region)
                self.dset.id.write_direct_chunk(offset, block.flat[0])
            else:
                self.dset[region] = block
        except H5_WRITE_ERRORS as exc:
            raise self.target.write_error(exc, f"write block {block_name(index)}") from exc
        self.unrecorded.append(index)

    def _record(self) -> None:
        if not self.unrecorded:
            return
        try:
            # Data first, then the record that claims it: a block is never marked done before it is flushed.
            self.h5file.flush()
            for index in self.unrecorded:
                self.done[flat_index(index, self.x.numblocks)] = True
            self.dset.attrs[H5_DONE_ATTR] = np.packbits(self.done)
            self.h5file.flush()
        except H5_WRITE_ERRORS as exc:
            raise self.target.write_error(exc, "record progress") from exc
        self.count += len(self.unrecorded)
        self.unrecorded = []
        if self.report:
            self.report(self.count, self.total)


def batched(items: list[tuple[int, ...]], n: int) -> Iterator[list[tuple[int, ...]]]:
    it = iter(items)
    while batch := list(islice(it, n)):
        yield batch
