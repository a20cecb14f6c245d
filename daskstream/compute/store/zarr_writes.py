"""The tasks that write a Zarr store's blocks, and who runs them.

A store's blocks are its target's chunks. Each task computes a block of the
array -- one chunk, or several along the first axis when an adaptive store
batches writes -- and writes every chunk it covers, marking each done after
its chunk is in place. :class:`PendingWrites` runs the blocks a store has
still to write: all at once by default, or, while :func:`runs_blocks_with`
names a runner (:mod:`daskstream.tuning.adaptive.stores`), in waves the
runner chooses.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.callbacks import Callback

from daskstream.advice import said
from daskstream.compute.store.chunk_writer import ChunkWriter, MetadataChangedError
from daskstream.compute.store.record import block_name, chunk_counts, reads_spans, span_chunk_shape
from daskstream.compute.store.span_writes import ChunksLeft, span_writes
from daskstream.compute.store.target import OVERWRITE, ProgressCallback, first_line, write_error
from daskstream.errors import DaskstreamError, InvalidArgumentError, TargetMismatchError
from daskstream.runtime.schedulers import active_client
from daskstream.runtime.stopping import raise_if_stopped

if TYPE_CHECKING:
    from daskstream.compute.store.zarr_target import ZarrTarget

Index = tuple[int, ...]

# What zarr raises when the array it opens is gone or its metadata is damaged: its own errors
# (zarr.errors.BaseZarrError, a ValueError), the ValueError of unreadable JSON, the KeyError of
# metadata missing a field and the TypeError of a field of the wrong type.
ZARR_NODE_ERRORS = (ValueError, KeyError, TypeError)

_RUNNER: contextvars.ContextVar[Callable[[PendingWrites], None] | None] = contextvars.ContextVar(
    "daskstream_store_block_runner", default=None
)


@contextlib.contextmanager
def runs_blocks_with(runner: Callable[[PendingWrites], None]) -> Iterator[None]:
    """Within the block, a Zarr store hands its :class:`PendingWrites` to ``runner`` instead of writing
    them all at once; ``runner`` must write every pending block (with :meth:`PendingWrites.write`)."""
    token = _RUNNER.set(runner)
    try:
        yield
    finally:
        _RUNNER.reset(token)


def block_runner() -> Callable[[PendingWrites], None] | None:
    """The runner :func:`runs_blocks_with` set, or ``None``."""
    return _RUNNER.get()


class PendingWrites:
    """The blocks a Zarr store has still to write, and how to write any of them.

    Attributes
    ----------
    x
        The array stored, on the target's chunk grid.
    chunks
        The target's chunk shape.
    pending
        The chunk indices still to write, in order.
    """

    def __init__(
        self, target: ZarrTarget, x: da.Array, pending: Collection[Index], total: int, report: ProgressCallback | None
    ) -> None:
        self.target = target
        self.x = x
        # Spans write chunks of the pieces they stream in; other arrays' blocks are the chunks.
        self.chunks = span_chunk_shape(x) or tuple(c[0] if c else 0 for c in x.chunks)
        # A store of spans finds its chunks left as it needs them (ChunksLeft): a pebibyte's are never listed.
        self.pending = pending if isinstance(pending, ChunksLeft) else list(pending)
        self.total = total
        self.report = report
        self.done = total - len(self.pending)

    def write(
        self,
        tasks: da.Array,
        blocks: Collection[Index],
        *,
        first_row: int = 0,
        threads: int | None = None,
        callbacks: Sequence[Callback] = (),
    ) -> None:
        """Write ``blocks`` (chunk indices) with the tasks of ``tasks``: rows ``first_row`` onwards of the
        stored array (all of it by default), cut into blocks of whole chunks.

        ``threads``: run on the threaded scheduler with that many threads
        (else on the active scheduler, with the target's own options);
        ``callbacks``: dask callbacks around the computation (local schedulers).
        """
        if reads_spans(tasks):
            self._write_spans(tasks, blocks, first_row=first_row, threads=threads, callbacks=callbacks)
            return
        shape = (first_row + tasks.shape[0], *tasks.shape[1:]) if tasks.ndim else ()
        rows = self.chunks[0] if self.chunks else 1
        if (
            tasks.ndim != self.x.ndim
            or any(n > m for n, m in zip(shape, self.x.shape))
            or (tasks.ndim and first_row % rows)
            or any(any(size % c for size in sizes[:-1]) for sizes, c in zip(tasks.chunks, self.chunks))
        ):
            raise InvalidArgumentError(
                f"{self.target.name}: tasks of chunks {tasks.chunks} from row {first_row} do not cover whole "
                f"chunks of {self.chunks} within {self.x.shape}"
            )
        target = self.target
        writes = da.map_blocks(
            _write_zarr_blocks,
            tasks,
            self.chunk_writes(),
            first_row,
            chunks=tuple((1,) * n for n in tasks.numblocks),
            dtype=bool,
            meta=np.empty((0,) * tasks.ndim, dtype=bool),
            name=f"daskstream-store-{tokenize(tasks.name, first_row, target.path, target.member)}",
        )
        starts = [np.cumsum((0, *sizes)) for sizes in tasks.chunks]
        shift = (first_row, *(0,) * (tasks.ndim - 1)) if tasks.ndim else ()
        # The task holding each block: the one whose region starts at or before the block's.
        covering: dict[Index, list[Index]] = {}
        for block in blocks:
            task = tuple(
                int(np.searchsorted(s, b * c - o, side="right")) - 1
                for s, b, c, o in zip(starts, block, self.chunks, shift)
            )
            covering.setdefault(task, []).append(block)
        # One optimized graph for all tasks, then only the needed ones: read and write fuse into one task.
        delayed = writes.to_delayed(optimize_graph=True)
        needed = [delayed[task] for task in covering]
        self._compute({d.key: covering[task] for d, task in zip(needed, covering)}, needed, threads, callbacks)

    def _write_spans(
        self,
        tasks: da.Array,
        blocks: Collection[Index],
        *,
        first_row: int,
        threads: int | None,
        callbacks: Sequence[Callback],
    ) -> None:
        """Write ``blocks`` of an array read in spans: tasks of about one span each, writing one chunk at a time."""
        if tasks is not self.x or first_row:
            raise InvalidArgumentError(f"{self.target.name}: an array read in spans is written whole, span by span")
        if not isinstance(blocks, ChunksLeft):
            counts = chunk_counts(tasks)
            blocks = ChunksLeft(counts, set(np.ndindex(*counts)) - set(blocks))
        writes, covering = span_writes(tasks, self.chunk_writes(), blocks)
        delayed = writes.to_delayed(optimize_graph=True).ravel().tolist()
        self._compute({d.key: chunks for d, chunks in zip(delayed, covering)}, delayed, threads, callbacks)

    def chunk_writes(self) -> ChunkWrites:
        """How this store's tasks write their chunks."""
        target = self.target
        return ChunkWrites(
            target._task_store(),
            target.member,
            target._task_done_dir(),
            target.name,
            target._chunk_writer(),
            self.chunks,
        )

    def _compute(
        self,
        covered: Mapping[Any, Iterable[Index]],
        needed: list[Any],
        threads: int | None,
        callbacks: Sequence[Callback],
    ) -> None:
        """Run the ``needed`` tasks (delayed), recording the blocks each covers (``covered``, by key) as it
        finishes."""
        target = self.target

        def finished(key: Any) -> None:
            for block in covered[key]:
                self.done += 1
                target._block_written(block)
            if self.report:
                self.report(self.done, self.total)

        client = active_client()
        if client is not None and threads is None:
            from distributed import as_completed

            futures = client.compute(needed)
            at = {future.key: d.key for future, d in zip(futures, needed)}
            try:
                for future in as_completed(futures):
                    future.result()
                    finished(at[future.key])
            except BaseException:
                client.cancel(futures)
                raise
            return

        def count(key: Any, *_: Any) -> None:
            if key in covered:
                finished(key)

        options = (
            target._compute_options(self.x) if threads is None else {"scheduler": "threads", "num_workers": threads}
        )
        with contextlib.ExitStack() as stack:
            stack.enter_context(Callback(posttask=count))
            for callback in callbacks:
                stack.enter_context(callback)
            dask.compute(*needed, **options)

    @property
    def planned_threads(self) -> int | None:
        """The threads the target writes with as planned (an object store's waiting on requests takes more
        than the cores), ``None`` for the active scheduler's own."""
        workers = self.target._compute_options(self.x).get("num_workers")
        return None if workers is None else int(workers)


@dataclasses.dataclass(frozen=True)
class ChunkWrites:
    """How a task writes chunks of a Zarr target, in any process: where the store is, how a chunk is encoded,
    where its marker goes.

    ``store_at``: the local store's path, or the :class:`Place` of a store on
    an object store (whose blocks the calling process records: ``done_dir``
    is ``None``). ``writer``: the encoder of whole chunks, else zarr writes.
    """

    store_at: Any
    member: str | None
    done_dir: str | None
    target_name: str
    writer: ChunkWriter | None
    chunks: tuple[int, ...]

    def region(self, index: Index, shape: tuple[int, ...]) -> tuple[slice, ...]:
        """The region of the target chunk ``index`` in an array of ``shape``."""
        return tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(index, self.chunks, shape))

    def opened(self) -> Callable[[Index, tuple[slice, ...], np.ndarray], None]:
        """A task's writer of chunks: ``write(index, region, data)`` puts chunk ``index`` in place, then its
        marker. The array, where zarr writes, is opened once, on the first chunk."""
        array: list[Any] = []

        def write(index: Index, region: tuple[slice, ...], data: np.ndarray) -> None:
            name = block_name(index)
            raise_if_stopped()  # a signal stops the writes of the tasks already running in this process too
            try:
                if self.writer is not None:
                    # A chunk encoded here, in this task's thread, and put in place whole.
                    self.writer.write(index, data)
                else:
                    if not array:
                        array.append(self._open_array())
                    local = isinstance(self.store_at, str)
                    with contextlib.nullcontext() if local else self.store_at.errors("write"):
                        array[0][region] = data
                if self.done_dir is not None:
                    # Only after the chunk is in place: an empty file appears whole or not at all.
                    with open(os.path.join(self.done_dir, name), "wb"):
                        pass
            except DaskstreamError:
                raise  # already says what failed (an object store refusing the write, say)
            except ZARR_NODE_ERRORS as exc:
                if self.writer is not None and not isinstance(exc, MetadataChangedError):
                    raise  # the chunk writer reads no metadata: anything else is not the target's doing
                # Before OSError: zarr's "node not found" errors are FileNotFoundErrors too, but no disk is to
                # blame. The array was deleted, replaced or damaged while store wrote it.
                raise TargetMismatchError(
                    said(
                        f"{self.target_name}: could not write block {name}: zarr could not open or write the "
                        f"array ({type(exc).__name__}: {first_line(exc)}); it was deleted, replaced or damaged "
                        "while store was writing it: ",
                        OVERWRITE,
                        " to store it again",
                    )
                ) from exc
            except OSError as exc:
                raise write_error(self.target_name, exc, f"write block {name}") from exc

        return write

    def _open_array(self) -> Any:
        """The target array, opened here, in whichever process runs the task: no handle travels in the graph."""
        import zarr

        zarr_store: Any
        if isinstance(self.store_at, str):
            zarr_store = zarr.storage.LocalStore(self.store_at)
        else:
            zarr_store = zarr.storage.FsspecStore.from_url(
                self.store_at.url, storage_options=self.store_at.storage_options
            )
        return zarr.open_array(store=zarr_store, path=self.member or "", mode="r+")


def _write_zarr_blocks(
    block: np.ndarray, writes: ChunkWrites, first_row: int = 0, block_info: dict | None = None
) -> np.ndarray:
    """Write one task's block into the chunks it covers (whole chunks of ``writes.chunks``; the tasks' array
    starts at row ``first_row`` of the stored one) and mark each done; runs inside a task, in any process."""
    info = block_info[0]  # type: ignore[index]
    location = tuple(
        (start + first_row, stop + first_row) if axis == 0 else (start, stop)
        for axis, (start, stop) in enumerate(info["array-location"])
    )
    chunks = writes.chunks
    first = tuple(start // c for (start, _), c in zip(location, chunks))
    covered = tuple(max(1, -(-(stop - start) // c)) for (start, stop), c in zip(location, chunks))
    write = writes.opened()
    for offset in np.ndindex(*covered):
        index = tuple(f + o for f, o in zip(first, offset))
        within = tuple(
            slice(o * c, min((o + 1) * c, stop - start)) for o, c, (start, stop) in zip(offset, chunks, location)
        )
        region = tuple(slice(start + w.start, start + w.stop) for w, (start, _) in zip(within, location))
        write(index, region, block[within])
    return np.ones((1,) * block.ndim, dtype=bool)
