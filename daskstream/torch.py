"""PyTorch adapter: a :func:`daskstream.stream` as an ``IterableDataset`` that splits work across DataLoader workers.

``StreamDataset(x, batch_size=..., shuffle=..., seed=...)`` needs ``torch``
(``pip install torch``), imported on first use of ``StreamDataset``::

    loader = torch.utils.data.DataLoader(StreamDataset("x.npy", batch_size=256), batch_size=None, num_workers=2)

>>> from daskstream.torch import worker_share
>>> worker_share(rank=1, world_size=2, worker_id=0, num_workers=3)
(3, 6)
"""

from __future__ import annotations

import random
from typing import Any

from daskstream.errors import InvalidArgumentError


def worker_share(*, rank: int, world_size: int, worker_id: int, num_workers: int) -> tuple[int, int]:
    """The ``(rank, world_size)`` one DataLoader worker of one training process streams as.

    Every (process, worker) pair gets its own rank among ``world_size *
    num_workers``, so the shares are disjoint and together cover the array.
    """
    return rank * num_workers + worker_id, world_size * num_workers


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError("daskstream.torch needs PyTorch: pip install torch") from exc
    return torch


def _stream_dataset_class() -> type:
    torch = _torch()

    class StreamDataset(torch.utils.data.IterableDataset):
        """A ``torch.utils.data.IterableDataset`` yielding batches of ``x`` as tensors.

        Parameters
        ----------
        x
            What :func:`daskstream.stream` takes (a path, Source, dask array, or a tuple of them).
        **stream_options
            :func:`daskstream.stream`'s options (``batch_size``, ``shuffle``,
            ``seed``, ``rank``, ``world_size``...). Batches are made here, so
            give the DataLoader ``batch_size=None``.

        Notes
        -----
        In each DataLoader worker the dataset streams a disjoint share
        (:func:`worker_share`), so no item is yielded twice. With ``shuffle``
        and no ``seed`` one is drawn now and shared with the workers. Call
        ``dataset.set_epoch(epoch)`` at the start of each epoch for a new order
        when the DataLoader uses worker processes (they get a fresh copy of
        the dataset each epoch); without workers the order changes by itself.
        """

        def __init__(self, x: Any, **stream_options: Any) -> None:
            super().__init__()
            options = dict(stream_options)
            if options.get("shuffle") and options.get("seed") is None:
                options["seed"] = random.SystemRandom().randrange(2**63)
            for name in ("rank", "world_size"):
                if name in options and (isinstance(options[name], bool) or not isinstance(options[name], int)):
                    raise InvalidArgumentError(f"{name}={options[name]!r} must be an int")
            self.x, self.options, self.epoch = x, options, 0

        def set_epoch(self, epoch: int) -> None:
            """Make the next iteration epoch ``epoch``."""
            self.epoch = int(epoch)

        def __iter__(self) -> Any:
            from daskstream.streaming import stream

            info = torch.utils.data.get_worker_info()
            rank, world_size = self.options.get("rank", 0), self.options.get("world_size", 1)
            if info is not None:
                rank, world_size = worker_share(
                    rank=rank, world_size=world_size, worker_id=info.id, num_workers=info.num_workers
                )
            batches = stream(self.x, **{**self.options, "rank": rank, "world_size": world_size})
            batches.set_epoch(self.epoch)
            if info is None:
                self.epoch += 1
            for batch in batches:
                yield tuple(torch.from_numpy(b) for b in batch) if isinstance(batch, tuple) else torch.from_numpy(batch)

    StreamDataset.__module__ = __name__
    return StreamDataset


def __getattr__(name: str) -> Any:
    # The class derives from torch's IterableDataset, so it is made (and torch imported) on first use;
    # once made it is an ordinary module attribute, which keeps it picklable for DataLoader workers.
    if name == "StreamDataset":
        cls = _stream_dataset_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["StreamDataset", "worker_share"]  # noqa: F822 - StreamDataset is made on first use
