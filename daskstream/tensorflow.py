"""TensorFlow adapter: :func:`daskstream.stream` as a ``tf.data.Dataset``, checkpointed with ``tf.train.Checkpoint``.

Needs TensorFlow (``pip install 'daskstream[tensorflow]'``); importing this
module imports ``tensorflow``::

    from daskstream.tensorflow import dataset

    data = dataset(("x.zarr", "y.zarr"), batch_size=256, shuffle=True, seed=0)
    model.fit(data, epochs=10, shuffle=False)  # each pass is the next epoch, shuffled by daskstream

**How it is built.** The batches are daskstream's (its split, shuffle and
read-ahead); TensorFlow sees a pipeline of its own ops, never a Python
generator: ``Dataset.range`` counts the epoch's batches, a ``scan`` holds the
epoch and the stream's state (seed, data, plan) as tensors, and a
``numpy_function`` hands over batch ``i`` of epoch ``e``. That makes an
iterator's position tf.data's own state, which ``tf.train.Checkpoint`` saves
and restores: ``Dataset.from_generator`` iterators cannot be saved at all
("GeneratorDataset does not support checkpointing", whatever the
``experimental_external_state_policy``). The pipeline uses tf.data's
*symbolic* checkpointing, so a checkpoint holds positions (about 2 KiB), not
the batches prefetched; after a restore, the batches from there are read
again from the files.
"""

from __future__ import annotations

import atexit
import json
import math
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from daskstream.advice import keyword, said
from daskstream.dependencies import optional_import
from daskstream.errors import InvalidArgumentError
from daskstream.streaming import Stream, stream

# An absolute import, so this module (daskstream.tensorflow) never finds itself: the real TensorFlow.
tf = optional_import("tensorflow", package="tensorflow", needed_for="daskstream.tensorflow", extra="tensorflow")

__all__ = ["dataset"]

# TensorFlow takes a numpy array as a tensor without copying it when the array is C-contiguous and aligned to
# EIGEN_MAX_ALIGN_BYTES (64 in builds for AVX-512, less in others); otherwise it copies it.
_ALIGNMENT = 64
# Keys of Stream.state_dict that say where in an epoch it is: set per batch, never carried with the stream's state.
_POSITION = ("epoch", "batches", "start", "global_batches")
# Every dataset's Python side, while it lives (see _refuse_calls_at_exit).
_LIVE: weakref.WeakSet[_Batches] = weakref.WeakSet()
_EXITING = threading.Event()


def dataset(x: Any, *, epoch: int = 0, **stream_options: Any) -> Any:
    """Batches of ``x`` as a ``tf.data.Dataset``: daskstream's split, shuffle and read-ahead, tf.data's iterators.

    Parameters
    ----------
    x
        What :func:`daskstream.stream` takes: a path, a Source, a dask array
        or a numpy array; a tuple of them yields tuples of tensors
        (features and labels).
    epoch
        The epoch the first pass over the dataset yields; each pass after is
        the next. Give ``model.fit``'s ``initial_epoch`` when resuming a
        Keras run, so the orders go on as before.
    **stream_options
        :func:`daskstream.stream`'s options: ``batch_size``, ``shuffle``,
        ``seed``, ``rank``, ``world_size``, ``shares``, ``shuffle_blocks``,
        ``prefetch``, ``memory_budget``, ``drop_last``... Batches, shuffling
        and sharding are daskstream's: do not ``batch``, ``shuffle`` or
        ``shard`` the dataset again.

    Returns
    -------
    tf.data.Dataset
        Elements are batches as tensors (a tuple of them for a tuple ``x``),
        with a static ``element_spec``: each array's shape with the batch
        axis ``None`` (``batch_size`` with ``drop_last=True``), and its
        dtype. ``cardinality()`` is the number of batches per pass (what
        Keras shows as steps). It ends with ``prefetch(tf.data.AUTOTUNE)``.

    Raises
    ------
    InvalidArgumentError
        What :func:`daskstream.stream` refuses; a dtype TensorFlow has no
        tensor of; ``worker=``/``num_workers=`` (DataLoader workers, which
        tf.data does not have).

    Notes
    -----
    **Epochs.** Each pass (``iter(data)``, a Keras epoch, each round of
    ``data.repeat()``) is the next epoch, whose order is fixed by
    ``(seed, epoch)``: two runs with one ``seed`` see the same batches. Pass
    over the dataset one iteration at a time.

    **Checkpoints.** An iterator is saved and restored with
    ``tf.train.Checkpoint`` as any tf.data iterator is; a restored one
    yields exactly the batches an uninterrupted run would have, in another
    process too, and the passes after it go on with the next epochs::

        iterator = iter(data.repeat())  # or iter(data), once per epoch
        ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, data=iterator)
        manager = tf.train.CheckpointManager(ckpt, "checkpoints", max_to_keep=3)
        ckpt.restore(manager.latest_checkpoint)  # nothing on the first run
        for step in range(steps):
            train_step(next(iterator))
            if step % 1000 == 0:
                manager.save()

    Make the dataset with the same arguments when restoring: the state
    carries the seed (one drawn without ``seed=`` too) and what the data and
    the split were, and a restore into a dataset of other data or another
    split is refused when its first batch is read. The pipeline turns on
    tf.data's symbolic checkpointing
    (``Options.experimental_symbolic_checkpoint``): a checkpoint holds
    positions, not the batches prefetched, and the batches after a restore
    are read again. Leave it on; off, tf.data saves the producer's position
    and its buffers, and the passes after a restored one may not follow it.

    **Keras.** ``model.fit(data, epochs=n, shuffle=False)``: Keras (3.15)
    warns that it ignores its own ``shuffle=True`` for a ``tf.data``
    dataset. ``model.fit`` does not save its iterator
    (``BackupAndRestore`` restores the epoch only): resume a run with
    ``dataset(..., epoch=initial_epoch)`` and
    ``model.fit(..., initial_epoch=initial_epoch)``.

    **Distributed training.** Each input pipeline takes its share as a rank
    of ``world_size``, with one ``seed`` for all, through
    ``tf.distribute.InputContext`` (this leaves tf.data's auto-sharding off)::

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        data = strategy.distribute_datasets_from_function(
            lambda ctx: dataset(
                "x.zarr",
                batch_size=ctx.get_per_replica_batch_size(1024),
                shuffle=True,
                seed=0,
                rank=ctx.input_pipeline_id,
                world_size=ctx.num_input_pipelines,
            )
        )

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from daskstream.tensorflow import dataset
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> np.save(path, np.arange(20, dtype="float32").reshape(10, 2))
    >>> data = dataset(path, batch_size=4)
    >>> data.element_spec
    TensorSpec(shape=(None, 2), dtype=tf.float32, name=None)
    >>> [batch[:, 0].numpy().tolist() for batch in data]
    [[0.0, 2.0, 4.0, 6.0], [8.0, 10.0, 12.0, 14.0], [16.0, 18.0]]
    """
    for name in ("worker", "num_workers"):
        if name in stream_options:
            raise InvalidArgumentError(
                said(
                    keyword(name),
                    " splits a rank among PyTorch DataLoader workers; a tf.data pipeline reads in one process: "
                    "leave it out (rank= and world_size= split among input pipelines)",
                )
            )
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise InvalidArgumentError(f"epoch={epoch!r} must be an int of at least 0")
    batches = _Batches(stream(x, **stream_options), epoch)
    return batches.pipeline()


class _Batches:
    """The Python side of one dataset: its stream, handing TensorFlow batch ``index`` of epoch ``epoch``.

    Calls come in order from tf.data's threads; the stream's iterator keeps
    reading ahead as long as they follow one another. Any other call (a
    restored iterator, a second one at once) moves the stream there with
    :meth:`Stream.load_state_dict`, which reads only what the batches from
    there need.
    """

    def __init__(self, batches: Stream, epoch: int) -> None:
        self.stream = batches
        self.specs = _specs(batches)
        # Shuffled batches are gathered straight into memory TensorFlow takes without a copy.
        batches.allocate = _aligned_empty
        self.next_epoch = epoch
        _LIVE.add(self)
        self._lock = threading.Lock()
        self._iterator: Iterator[Any] | None = None
        # (epoch, batch) that self._iterator yields next.
        self._at: tuple[int, int] | None = None

    def pipeline(self) -> Any:
        """The ``tf.data.Dataset`` (see :func:`dataset`)."""
        count, zipped, axis = len(self.stream), self.stream.zipped, self.stream.axis
        specs = self.specs
        dtypes = [spec.dtype for spec in specs]

        # The functions below are TensorFlow graphs built once; autograph has nothing to convert in them.
        @tf.autograph.experimental.do_not_convert
        def begin(state: Any, index: Any) -> Any:
            # A fresh iterator starts at state (-1, ""): the first batch's call picks the epoch and takes the
            # stream's state, which the scan then holds. A restored iterator gets both back from the checkpoint.
            def new_pass() -> Any:
                # Declared stateless, as read is: with a stateful function in the pipeline, tf.data's symbolic
                # checkpointing logs a warning for every batch. read's batches are a function of its inputs;
                # this call's result is kept by the scan (and its checkpoints), so a pass never calls it
                # twice. The calls come one at a time, in order (map_parallelization is off below).
                picked, held = tf.numpy_function(self.begin, [index], [tf.int64, tf.string], stateful=False)
                return tf.ensure_shape(picked, ()), tf.ensure_shape(held, ())

            picked, held = tf.cond(state[0] < 0, new_pass, lambda: state)
            return (picked, held), (picked, held, index)

        # The end marker is empty along the batch axis, so that axis is fixed (drop_last) only once it is gone.
        read_shapes = [[None if a == axis else n for a, n in enumerate(spec.shape)] for spec in specs]

        @tf.autograph.experimental.do_not_convert
        def read(picked: Any, held: Any, index: Any) -> Any:
            parts = tf.numpy_function(self.read, [picked, index, held], dtypes, stateful=False)
            return tuple(tf.ensure_shape(part, shape) for part, shape in zip(parts, read_shapes, strict=True))

        @tf.autograph.experimental.do_not_convert
        def is_batch(*parts: Any) -> Any:
            return tf.shape(parts[0])[axis] > 0

        @tf.autograph.experimental.do_not_convert
        def element(*parts: Any) -> Any:
            shaped = tuple(tf.ensure_shape(part, spec.shape) for part, spec in zip(parts, specs, strict=True))
            return shaped if zipped else shaped[0]

        # One index past the last batch: its call yields an empty batch, dropped here, which tells the
        # stream that the pass is over (see read), also when a restored iterator had no batch left.
        data = (
            tf.data.Dataset.range(count + 1)
            .scan((tf.constant(-1, tf.int64), tf.constant(b"")), begin)
            .map(read)
            .filter(is_batch)
            .map(element)
            .apply(tf.data.experimental.assert_cardinality(count))
            .prefetch(tf.data.AUTOTUNE)
        )
        options = tf.data.Options()
        options.experimental_symbolic_checkpoint = True
        options.experimental_optimization.map_parallelization = False
        if self.stream.world_size > 1:
            # Already this rank's share: tf.distribute's auto-sharding would split it again.
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return data.with_options(options)

    def begin(self, _index: Any) -> tuple[np.int64, bytes]:
        """A new pass: its epoch, and the stream's state (seed, data, plan) that a restore checks and resumes."""
        _refuse_if_exiting()
        with self._lock:
            picked, self.next_epoch = self.next_epoch, self.next_epoch + 1
            held = {key: value for key, value in self.stream.state_dict().items() if key not in _POSITION}
        return np.int64(picked), json.dumps(held).encode()

    def read(self, picked: Any, index: Any, held: Any) -> list[np.ndarray]:
        """Batch ``index`` of epoch ``picked`` as arrays TensorFlow takes without a copy; past the last, empty ones."""
        _refuse_if_exiting()
        picked, index = int(picked), int(index)
        with self._lock:
            # The pass in progress is this epoch, whichever process picked it: the next pass is the one after.
            self.next_epoch = picked + 1
            if index >= len(self.stream):
                if self._iterator is not None and self._at == (picked, index):
                    # Run the stream's iteration to its end, which begins the next epoch's reads.
                    for _ in self._iterator:
                        pass
                else:
                    # A restored iterator with no batch left: the passes after it go on with its state (seed).
                    self._load(picked + 1, 0, held)
                self._iterator, self._at = None, None
                return self._empty()
            iterator = self._iterator
            if iterator is None or self._at != (picked, index):
                iterator = self._seek(picked, index, held)
            batch = next(iterator)
            self._at = (picked, index + 1)
        parts = batch if self.stream.zipped else (batch,)
        return [_for_tensorflow(part) for part in parts]

    def _seek(self, picked: int, index: int, held: Any) -> Iterator[Any]:
        """The stream's iterator from batch ``index`` of epoch ``picked``, with the state ``held`` carried."""
        self._load(picked, index, held)
        self._iterator = iter(self.stream)
        return self._iterator

    def _load(self, picked: int, index: int, held: Any) -> None:
        """Make the stream's next iteration epoch ``picked`` from batch ``index``, with the state ``held``."""
        if self._iterator is not None:
            close = getattr(self._iterator, "close", None)
            if close is not None:
                close()  # stops the reads of the pass left
        self._iterator = None
        saved = json.loads(bytes(held).decode())
        # The stream checks that the state is of this data and split, and takes its seed.
        self.stream.load_state_dict({**saved, "epoch": picked, "batches": index})
        state = self.stream.state_dict()
        if (state["epoch"], state["batches"]) != (picked, index):
            # An elastic stream takes a position saved on another world size as a global one, which the
            # TensorFlow iterator's count of this rank's batches cannot follow.
            raise InvalidArgumentError(
                f"the restored iterator is at batch {index} of epoch {picked}, which this dataset's stream does "
                "not resume at; make the dataset with the arguments it was saved with"
            )

    def _empty(self) -> list[np.ndarray]:
        empty = []
        for spec, source in zip(self.specs, self.stream.inputs, strict=True):
            shape = [0 if a == self.stream.axis else n for a, n in enumerate(source.shape)]
            empty.append(np.empty(shape, spec.dtype.as_numpy_dtype))
        return empty


def _refuse_if_exiting() -> None:
    if _EXITING.is_set():
        raise RuntimeError("the Python interpreter is exiting: no more batches")


@atexit.register
def _refuse_calls_at_exit() -> None:
    """Fail the calls tf.data's threads still make into Python, before the interpreter finalizes.

    A live iterator's prefetch thread keeps calling ``read``; one such call
    asking for the GIL once finalizing has begun never returns, and the exit
    hangs (1 exit in 4 with an iterator left alive, as with TensorFlow's own
    ``Dataset.from_generator``). Failing at once, the calls fill the prefetch
    buffers with errors in a moment, and the threads then wait rather than
    call.
    """
    if len(_LIVE):
        _EXITING.set()
        time.sleep(0.1)


def _specs(batches: Stream) -> list[Any]:
    """One ``tf.TensorSpec`` per array: its shape with the batch axis unknown (fixed with drop_last), its dtype."""
    specs = []
    for source in batches.inputs:
        if source.dtype.kind not in "biufc":
            raise InvalidArgumentError(
                f"{source.name} holds {source.dtype}, which TensorFlow has no tensor of; stream numbers "
                "(a dask array's .astype(...) is converted as it is read)"
            )
        try:
            dtype = tf.as_dtype(source.dtype.newbyteorder("="))
        except TypeError as exc:
            raise InvalidArgumentError(
                f"{source.name} holds {source.dtype}, which TensorFlow has no tensor of"
            ) from exc
        shape: list[int | None] = list(source.shape)
        shape[batches.axis] = batches.batch_size if batches.drop_last else None
        specs.append(tf.TensorSpec(shape, dtype))
    return specs


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty(shape, dtype)`` starting on a multiple of :data:`_ALIGNMENT` bytes."""
    size = math.prod(shape) * dtype.itemsize
    raw = np.empty(size + _ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _ALIGNMENT
    return raw[start : start + size].view(dtype).reshape(shape)


def _for_tensorflow(array: np.ndarray) -> np.ndarray:
    """``array`` as TensorFlow takes it without a copy: itself when it can be, else one aligned copy."""
    if array.flags.c_contiguous and array.dtype.isnative and array.ctypes.data % _ALIGNMENT == 0:
        return array
    out = _aligned_empty(array.shape, array.dtype.newbyteorder("="))
    out[...] = array
    return out
