"""PyTorch adapter: :func:`daskstream.stream` as an ``IterableDataset`` for ``torch.utils.data.DataLoader``.

Needs PyTorch (``pip install 'daskstream[torch]'``); importing this module
imports ``torch``::

    from daskstream.torch import StreamDataset

    dataset = StreamDataset("x.npy", batch_size=256, shuffle=True, seed=0, rank=rank, world_size=world)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None)  # the stream reads in threads of its own
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

from daskstream.advice import keyword, said
from daskstream.dependencies import optional_import
from daskstream.errors import InvalidArgumentError, shown
from daskstream.streaming import stream
from daskstream.streaming.states import check_state

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
    the rank's items and batch count do not depend on ``num_workers``, but
    its batches do (the loader takes its workers' batches in turn, and each
    worker shuffles its own run); ``elastic=True`` gives the same batches in
    the same order for any number of workers.

    **Workers.** ``num_workers=0`` is usually the fastest: the stream reads,
    decodes and gathers in threads of its own, outside the GIL. Each worker
    is a stream of its own, planned for the whole memory budget: ``W``
    workers may hold ``W`` times it (give each a share with
    ``memory_budget=``).

    **Orders.** With ``shuffle`` and no ``seed``, one is drawn now and
    shared with the workers. Call ``dataset.set_epoch(epoch)`` at the start
    of each epoch (as with ``DistributedSampler``) and epoch ``e``'s order is
    fixed by ``(seed, e)``, for any sequence of epochs set: the epoch is
    kept in shared memory, so ``set_epoch`` reaches workers already running
    (``persistent_workers=True``) as well as new ones, with every start
    method. Without ``set_epoch`` the order still changes every epoch:
    without workers or with persistent ones, the epoch advances by one each
    time; with workers started afresh each epoch, the items within each
    rank's share are mixed by the DataLoader's per-epoch seed (reproducible
    with ``torch.manual_seed`` or the DataLoader's ``generator``), while the
    split among ranks stays that of the epoch last set.

    **Checkpoints.** ``state_dict()`` and ``load_state_dict()`` follow
    torchdata's ``Stateful`` protocol, so ``StatefulDataLoader`` saves and
    restores each worker's position and a restored loader yields exactly
    the batches an uninterrupted one would have, reading only what they need
    (:class:`daskstream.Stream`). Without workers, the dataset's own
    ``state_dict()`` is the position. ``load_state_dict`` in the main process
    also takes a ``StatefulDataLoader``'s whole state: the workers started
    next resume from it (a plain ``DataLoader`` then resumes too), and an
    ``elastic=True`` dataset resumes it on another world size or number of
    workers, continuing the same global order.
    """

    def __init__(self, x: Any, **stream_options: Any) -> None:
        super().__init__()
        options = dict(stream_options)
        for name in ("worker", "num_workers"):
            if name in options:
                raise InvalidArgumentError(
                    said(
                        keyword(name), " is set from the DataLoader's workers; leave it out of StreamDataset's options"
                    )
                )
        # A seed drawn here is shared with the workers; a state saved by another run brings its own.
        self._seed_drawn = bool(options.get("shuffle")) and options.get("seed") is None
        if self._seed_drawn:
            options["seed"] = random.SystemRandom().randrange(2**63)
        for name in ("rank", "world_size"):
            if name in options and (isinstance(options[name], bool) or not isinstance(options[name], int)):
                raise InvalidArgumentError(said(keyword(name, options[name]), " must be an int"))
        self.x, self.options = x, options
        # In shared memory, so that a worker's copy (persistent ones included, whatever the start method)
        # reads them at the start of each epoch: the epoch set last, how many times set_epoch was called,
        # and whether a job position loaded in the main process is still to be resumed (1) or not (0).
        self._shared = torch.zeros(3, dtype=torch.int64).share_memory_()
        # This copy's count: the epoch it counts from, the set_epoch call that set it, epochs iterated since.
        self._epoch_base, self._epoch_calls, self._iterations = 0, 0, 0
        # An elastic job position loaded in the main process, which the workers resume from.
        self._job_position: dict[str, Any] | None = None
        self._worker_stream: Any = None
        # Checks the arguments here, in the main process, and plans the split once.
        self._plan = self._stream()

    def _stream(self, worker: int = 0, num_workers: int = 1) -> Any:
        made = stream(self.x, **self.options, worker=worker, num_workers=num_workers)
        made.seed_given = not self._seed_drawn
        return made

    @property
    def epoch(self) -> int:
        """The epoch the next iteration yields (in this process)."""
        self._follow_set_epoch()
        return self._epoch_base + self._iterations

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (as ``DistributedSampler.set_epoch`` does), in this process
        and in every DataLoader worker, running or started later."""
        epoch = int(epoch)
        calls = int(self._shared[1]) + 1
        self._shared[0], self._shared[1] = epoch, calls
        self._epoch_base, self._epoch_calls, self._iterations = epoch, calls, 0
        if self._job_position is not None and self._job_position["epoch"] != epoch:
            self._drop_job_position()
        self._plan.set_epoch(epoch)
        if self._worker_stream is not None:
            self._worker_stream.set_epoch(epoch)

    def _follow_set_epoch(self) -> None:
        """Take up an epoch set since this copy last looked (in the main process, for a worker)."""
        calls = int(self._shared[1])
        if calls != self._epoch_calls:
            self._epoch_base, self._epoch_calls, self._iterations = int(self._shared[0]), calls, 0

    def _consumer(self) -> Any:
        """The stream this process iterates: the planned one, or in a DataLoader worker its own share."""
        info = get_worker_info()
        if info is None:
            return self._plan
        if self._worker_stream is None or self._worker_stream.num_workers != info.num_workers:
            self._worker_stream = self._worker_share(info)
        return self._worker_stream

    def _worker_share(self, info: Any) -> Any:
        """A loader worker's own stream, made once per worker process."""
        made = self._stream(info.id, info.num_workers)
        made.loop_ends_epoch = False
        if not self._epoch_calls:
            # Workers started afresh each epoch see the same epoch every time: the DataLoader's per-epoch
            # seed (shared by a loader's workers) changes the order of the items instead. Set as the worker
            # starts, so that every state it saves (its first included) holds it; a state loaded brings its own.
            made.order_entropy = int(info.seed) - int(info.id)
        return made

    def state_dict(self) -> dict[str, Any]:
        """Where the batches this copy handed out end (see :meth:`daskstream.Stream.state_dict`).

        In a DataLoader worker, that worker's position (torchdata's
        ``StatefulDataLoader`` gathers them); without workers, the dataset's.
        """
        self._follow_set_epoch()
        return self._consumer().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where ``state`` ends.

        Parameters
        ----------
        state
            This dataset's ``state_dict()`` (without workers; in a worker,
            torchdata's ``StatefulDataLoader`` passes each its own), or, in the
            main process, a ``StatefulDataLoader``'s ``state_dict()``: without
            workers its position; with workers, for an ``elastic=True``
            dataset, the job's global position, from which the workers
            started next resume, on any world size and number of workers.

        Raises
        ------
        SourceChangedError, InvalidArgumentError
            As :meth:`daskstream.Stream.load_state_dict`: other data, or a
            stream cut otherwise; a loader state with workers for a dataset
            that is not elastic (load it into the ``StatefulDataLoader``,
            which restores each worker's position and the order it takes
            them back in).
        """
        info = get_worker_info()
        if info is None and _is_loader_state(state):
            workers = _dataset_states(state)
            if "_snapshot" not in state:  # a loader without workers: the position is this process's
                if not workers:
                    raise InvalidArgumentError(_NO_POSITION)
                self._load(self._plan, next(iter(workers.values())))
                return
            position = _job_position(workers, self._plan)
            # Checked here, in the main process, rather than in every worker; and this process resumes from
            # it as well, should the dataset be iterated without workers.
            self._load(self._plan, position)
            self._job_position = position
            self._shared[2] = 1
            return
        if info is not None:
            # A worker's own position (StatefulDataLoader): a fresh share, not one a job position moved.
            self._worker_stream = self._worker_share(info)
        self._load(self._consumer(), state)

    def _load(self, consumer: Any, state: dict[str, Any]) -> None:
        consumer.load_state_dict(state)
        # The next iteration is the state's epoch, whatever set_epoch said before it was loaded.
        self._epoch_base, self._epoch_calls, self._iterations = consumer.epoch, int(self._shared[1]), 0

    def _drop_job_position(self) -> None:
        self._job_position = None
        self._shared[2] = 0

    def __iter__(self) -> Any:
        # The epoch and the position are settled now, as StatefulDataLoader reads state_dict() right after
        # iter() and before the first batch; the epoch counts as iterated with its first batch, so that an
        # iterator made and dropped unused (torchdata makes one to restore a state, then another once the
        # saved epoch had ended) leaves the next one the same epoch.
        info = get_worker_info()
        self._follow_set_epoch()
        batches = self._consumer()
        epoch = self._epoch_base + self._iterations
        shared = None
        resumed = False
        if info is not None:
            position = self._job_position
            if position is not None and int(self._shared[2]) and position["epoch"] == epoch:
                batches.load_state_dict(position)
                resumed = True
            batches.in_caller_thread = True
            shared = _SharedBatches()
            batches.allocate = shared
        if batches.epoch != epoch:
            batches.set_epoch(epoch)
        done = self._drop_job_position if resumed else None
        return _as_tensors(iter(batches), shared, self._counted_iteration, done)

    def _counted_iteration(self) -> None:
        self._iterations += 1

    def __getstate__(self) -> dict[str, Any]:
        # Workers plan their own share; the main process's plan (and its open sources) stays here, but its
        # seed (drawn when none was given, or loaded) goes with the options.
        options = {**self.options, "seed": self._plan.seed} if self._plan is not None else self.options
        return {**self.__dict__, "options": options, "_plan": None, "_worker_stream": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._plan is None and get_worker_info() is None:
            self._plan = self._stream()

    def __len__(self) -> int:
        """Batches this rank yields each epoch, whatever the DataLoader's number of workers."""
        return self._plan.rank_batches

    def __repr__(self) -> str:
        return f"<daskstream StreamDataset: {self._plan!r}>"


def _as_tensors(batches: Any, shared: _SharedBatches | None, started: Any, done: Any = None) -> Any:
    """The stream's batches as tensors (made in shared memory in a worker), tuples as :class:`Batch`;
    ``started()`` once the first is asked for, ``done()`` once they are all handed out."""
    as_tensor = torch.from_numpy if shared is None else shared.tensor
    started()
    for batch in batches:
        if isinstance(batch, tuple):
            yield Batch(*(as_tensor(part) for part in batch))
        else:
            yield as_tensor(batch)
    if done is not None:
        done()


def _is_loader_state(state: Any) -> bool:
    """Whether ``state`` is a torchdata ``StatefulDataLoader``'s (with or without workers)."""
    return isinstance(state, dict) and ("_snapshot" in state or "_num_yielded" in state)


def _dataset_states(loader_state: dict[str, Any]) -> dict[Any, Any]:
    """The dataset's state of each worker in a ``StatefulDataLoader`` state, by the loader's name for the worker
    (the one dataset state alone without workers); each still to be checked as a stream's state."""
    if "_snapshot" not in loader_state:
        single = loader_state.get("dataset_state")
        return {"dataset_state": single} if single else {}
    snapshot = loader_state["_snapshot"]
    workers = snapshot.get("_worker_snapshots", {}) if isinstance(snapshot, dict) else snapshot
    if not isinstance(workers, dict):
        raise InvalidArgumentError(
            f"the StatefulDataLoader state's _snapshot is {shown(snapshot)}, expected a dict whose "
            "'_worker_snapshots' is a dict of each worker's snapshot: load a state that "
            "StatefulDataLoader.state_dict() returned, unchanged"
        )
    found = {}
    for key, worker_snapshot in workers.items():
        if worker_snapshot is not None and not isinstance(worker_snapshot, dict):
            raise InvalidArgumentError(
                f"the StatefulDataLoader state's snapshot of {key!r} is {shown(worker_snapshot)}, expected a "
                "dict (its 'dataset_state' is the worker's position): load a state that "
                "StatefulDataLoader.state_dict() returned, unchanged"
            )
        dataset_state = (worker_snapshot or {}).get("dataset_state")
        if dataset_state:
            found[key] = dataset_state
    return found


# A worker's state: what may differ between the workers of one loader (the rest names the same epoch and plan).
_PER_WORKER = ("batches", "global_batches")
_MISSING = object()
_NO_POSITION = (
    "the StatefulDataLoader state holds no StreamDataset position (it was saved before any batch was "
    "taken, or from a loader over another dataset)"
)


def _job_position(states: dict[Any, Any], plan: Any) -> dict[str, Any]:
    """An elastic job's global position from its workers' states: where every rank resumes, on any world size.

    A worker's state says only which of its rank's batches it yields next;
    the rank has taken every batch before the least of these (the loader
    takes them from its workers in turn), and with ranks in step the job has
    taken that many times the world size of global batches from where the
    epoch's shares were cut. Every state is checked as a stream's first
    (:func:`~daskstream.streaming.states.check_state`), and the states as
    one loader's: every worker's once, in one epoch, of one plan.
    """
    if not states:
        raise InvalidArgumentError(_NO_POSITION)
    checked = {}
    for key, state in states.items():
        try:
            checked[key] = check_state(state, seed=plan.seed)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"the StatefulDataLoader state's {key!r}: {exc}") from None
    first = next(iter(checked.values()))
    saved = first["plan"]
    if not saved["elastic"]:
        raise InvalidArgumentError(
            "a StatefulDataLoader state with workers holds one position per worker, and the order the loader "
            "takes them back in: load it into the StatefulDataLoader (loader.load_state_dict(state)); "
            "StreamDataset.load_state_dict takes it for an elastic=True dataset, to resume on another world "
            "size or number of workers"
        )
    epochs = {state["epoch"] for state in checked.values()}
    workers = sorted(state["plan"]["worker"] for state in checked.values())
    if len(epochs) != 1 or workers != list(range(saved["num_workers"])):
        raise InvalidArgumentError(
            f"the StatefulDataLoader state holds the positions of workers {shown(workers)} of "
            f"{saved['num_workers']} in epochs {shown(sorted(epochs))}: a job position needs every worker's, "
            "once each, in one epoch"
        )
    alike = _one_loaders(first)
    for key, state in checked.items():
        own = _one_loaders(state)
        differs = [name for name in sorted({*alike, *own}) if alike.get(name, _MISSING) != own.get(name, _MISSING)]
        if differs:
            raise InvalidArgumentError(
                f"the StatefulDataLoader state's {key!r} differs from the other workers' in {', '.join(differs)}: "
                "the workers of one loader share their epoch's plan, seed and data; load a state that "
                "StatefulDataLoader.state_dict() returned, unchanged"
            )
    workers_count, world = saved["num_workers"], saved["world_size"]
    steps = min(state["plan"]["worker"] + state["batches"] * workers_count for state in checked.values())
    position = {**first, "batches": 0, "start": 0}
    position["global_batches"] = min(first.get("start", 0) + steps * world, plan.global_batches)
    return position


def _one_loaders(state: dict[str, Any]) -> dict[str, Any]:
    """What every worker's state of one loader holds alike: all but its own position and worker."""
    alike = {key: value for key, value in state.items() if key not in (*_PER_WORKER, "plan")}
    alike.update({f"plan[{key!r}]": value for key, value in state["plan"].items() if key != "worker"})
    return alike


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
