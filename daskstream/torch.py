"""PyTorch adapter: :func:`daskstream.stream` as an ``IterableDataset`` for ``torch.utils.data.DataLoader``.

Needs PyTorch (``pip install 'daskstream[torch]'``); importing this module
imports ``torch``::

    from daskstream.torch import StreamDataset

    dataset = StreamDataset("x.npy", batch_size=256, shuffle=True, seed=0, rank=rank, world_size=world)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True)
    for epoch in range(epochs):
        dataset.set_epoch(epoch)  # optional: see StreamDataset
        for x in loader:
            ...

``StreamDataset`` is an ordinary importable class, so it pickles to workers
started with ``spawn`` and ``forkserver`` as well as ``fork``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from daskstream.dependencies import optional_import
from daskstream.errors import InvalidArgumentError
from daskstream.streaming import stream

torch = optional_import("torch", package="torch", needed_for="daskstream.torch", extra="torch")
from torch.utils.data import IterableDataset, get_worker_info  # noqa: E402 - only once torch is known to import

__all__ = ["Batch", "StreamDataset"]


class Batch(tuple):
    """Matching batches of zipped arrays, as a tuple that DataLoader's conversion keeps a tuple.

    ``DataLoader`` turns a plain tuple into a list; it rebuilds a tuple that
    has ``_fields`` (a named tuple) as its own type, so this one survives it
    and ``pin_memory``.
    """

    _fields: tuple[str, ...] = ()

    def __new__(cls, *parts: Any) -> Batch:
        return super().__new__(cls, parts)

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)


class StreamDataset(IterableDataset):
    """A ``torch.utils.data.IterableDataset`` yielding batches of ``x`` as tensors.

    Parameters
    ----------
    x
        What :func:`daskstream.stream` takes (a path, Source, dask array, or a
        tuple of them, which yields :class:`Batch` tuples).
    **stream_options
        :func:`daskstream.stream`'s options (``batch_size``, ``shuffle``,
        ``seed``, ``rank``, ``world_size``, ``shares``...). Batches are made
        here, so give the DataLoader ``batch_size=None``.

    Notes
    -----
    **Split.** Every rank takes an equal share (``shares="pad"`` by default,
    as ``DistributedSampler``), cut from shards that depend only on the data
    and the arguments, so ranks on machines of any size split alike and
    yield the same number of batches (``len(dataset)``, also the
    DataLoader's ``len()``). Within a rank, the batches are split among the
    DataLoader's workers in contiguous runs: no item is yielded twice, and
    the rank's batch count does not depend on ``num_workers``.

    **Orders.** With ``shuffle`` and no ``seed``, one is drawn now and
    shared with the workers. Call ``dataset.set_epoch(epoch)`` at the start
    of each epoch (as with ``DistributedSampler``) and epoch ``e``'s order is
    fixed by ``(seed, e)``, also with ``persistent_workers=True``, whose
    workers count the epochs themselves on top of the epoch they started
    with. Without ``set_epoch`` the order still changes every epoch: without
    workers or with persistent ones by the same count; with workers started
    afresh each epoch, the items within each rank's share are mixed by the
    DataLoader's per-epoch seed (reproducible with ``torch.manual_seed`` or
    the DataLoader's ``generator``), while the split among ranks stays that
    of the epoch last set.
    """

    def __init__(self, x: Any, **stream_options: Any) -> None:
        super().__init__()
        options = dict(stream_options)
        for name in ("worker", "num_workers"):
            if name in options:
                raise InvalidArgumentError(
                    f"{name}= is set from the DataLoader's workers; leave it out of StreamDataset's options"
                )
        if options.get("shuffle") and options.get("seed") is None:
            options["seed"] = random.SystemRandom().randrange(2**63)
        for name in ("rank", "world_size"):
            if name in options and (isinstance(options[name], bool) or not isinstance(options[name], int)):
                raise InvalidArgumentError(f"{name}={options[name]!r} must be an int")
        self.x, self.options = x, options
        self.epoch = 0
        self._epoch_set = False
        # Epochs this copy has iterated: in a persistent worker, the epochs since it started.
        self._iterations = 0
        self._worker_stream: Any = None
        # Checks the arguments here, in the main process, and plans the split once.
        self._plan = self._stream()

    def _stream(self, worker: int = 0, num_workers: int = 1) -> Any:

        return stream(self.x, **self.options, worker=worker, num_workers=num_workers)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (as ``DistributedSampler.set_epoch`` does)."""
        self.epoch = int(epoch)
        self._epoch_set = True
        self._iterations = 0

    def __getstate__(self) -> dict[str, Any]:
        # Workers plan their own share; the main process's plan (and its open sources) stays here.
        return {**self.__dict__, "_plan": None, "_worker_stream": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._plan is None and get_worker_info() is None:
            self._plan = self._stream()

    def __len__(self) -> int:
        """Batches this rank yields each epoch, whatever the DataLoader's number of workers."""
        return self._plan.rank_batches

    def __iter__(self) -> Any:
        info = get_worker_info()
        epoch = self.epoch + self._iterations
        self._iterations += 1
        if info is None:
            batches = self._plan
        else:
            # A persistent worker keeps its stream, and with it the next epoch's first reads.
            if self._worker_stream is None or self._worker_stream.num_workers != info.num_workers:
                self._worker_stream = self._stream(info.id, info.num_workers)
            batches = self._worker_stream
            if not self._epoch_set:
                # Workers started afresh each epoch see the same epoch every time: the DataLoader's
                # per-epoch seed (shared by a loader's workers) changes the order of the items instead.
                batches.order_entropy = int(info.seed) - int(info.id)
            batches.in_caller_thread = True
            shared = _SharedBatches()
            batches.allocate = shared
        batches.set_epoch(epoch)
        as_tensor = torch.from_numpy if info is None else shared.tensor
        for batch in batches:
            if isinstance(batch, tuple):
                yield Batch(*(as_tensor(part) for part in batch))
            else:
                yield as_tensor(batch)

    def __repr__(self) -> str:
        return f"<daskstream StreamDataset: {self._plan!r}>"


class _SharedBatches:
    """Batches gathered straight into shared memory in a loader worker.

    A tensor a DataLoader worker sends is first copied into shared memory;
    one made there is sent as a handle, so the batch is copied once (from the
    read into place), not twice.
    """

    def __init__(self) -> None:
        self._made: dict[int, Any] = {}

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        try:
            tensor = torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype).share_memory_()
        except (TypeError, RuntimeError):  # a dtype torch has no tensor of: gathered as usual
            return np.empty(shape, dtype)
        array = tensor.numpy()
        self._made[array.__array_interface__["data"][0]] = tensor
        return array

    def tensor(self, array: np.ndarray) -> Any:
        """The shared tensor ``array`` was made as, else ``array`` as a tensor."""
        made = self._made.pop(array.__array_interface__["data"][0], None)
        if made is not None and tuple(made.shape) == array.shape:
            return made
        return torch.from_numpy(array)
