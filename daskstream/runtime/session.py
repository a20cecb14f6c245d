"""Sessions: choose where computations run, and make the planner plan for that place.

>>> import daskstream as ds
>>> from daskstream.runtime.schedulers import current
>>> from daskstream.runtime.session import session
>>> with session("sync", memory_budget="256MiB", progress=False) as s:
...     plan = ds.plan_chunks((1000, 1000), "f8")
...     current() is s, s.kind, plan.memory_budget, plan.threads, plan.workers
(True, 'sync', 268435456, 1, 1)
>>> current() is None
True

What the planner sees inside a session, for each scheduler:

==============  =======================================  ===========  ==========================
scheduler       memory budget (per worker)               threads      workers
==============  =======================================  ===========  ==========================
``sync``        a share of this machine's memory         1            1
``threads``     a share of this machine's memory         usable CPUs  1
``processes``   that share divided among the processes   1            usable CPUs (one process
                                                                      each, as dask's pool runs)
distributed     the smallest worker memory limit, times  per worker   the workers connected
                distributed's lowest memory threshold
                (0.6), less what an idle worker holds
==============  =======================================  ===========  ==========================

(``dask.config`` ``num_workers``, when set, replaces "usable CPUs".) A budget
given to :func:`session`, else the ``daskstream.memory-budget`` of a cluster
file, replaces the memory column; an argument given to
:func:`daskstream.plan_chunks` still wins over everything.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import TYPE_CHECKING, Any

import dask
import dask.config

from daskstream.advice import keyword, said
from daskstream.allocator import cap_malloc_arenas
from daskstream.errors import InvalidArgumentError
from daskstream.graph.layers import read_layers
from daskstream.planning.budget import parse_budget
from daskstream.runtime import clusters
from daskstream.runtime.addresses import check_scheduler_address
from daskstream.runtime.clusters import join
from daskstream.runtime.metering import ReadMeter, process_initializer, shared_counter
from daskstream.runtime.pools import one_process_pool
from daskstream.runtime.progress import ReadProgress, TaskProgress, planned_bytes, progress_bar, rate_beside
from daskstream.runtime.resources import Resources, _client_resources, _usable_cpus, machine_resources, resources_for
from daskstream.runtime.scheduler_loss import close_client, guard_scheduler, lost_scheduler_error, scheduler_lost
from daskstream.runtime.schedulers import enter, leave
from daskstream.runtime.stopping import ctrl_c_kept_from_children, quiet_workers_when_stopped

if TYPE_CHECKING:
    from types import TracebackType

LOCAL_SCHEDULERS = ("sync", "threads", "processes")
SCHEDULERS = (*LOCAL_SCHEDULERS, "distributed")

# Something that watches each computation of a session: called with the session and the objects
# computed, it returns a context manager that is entered before the computation and left after it.
Observer = Callable[["Session", tuple[Any, ...]], AbstractContextManager[object]]

# The observers every session made with observers=None starts with (see observe_computations).
_default_observers: list[Observer] = []


def observe_computations(observer: Observer) -> None:
    """Watch every computation of sessions made from now on with ``observer`` (once, however often added).

    The tuner registers its online feedback this way (:mod:`daskstream.tuning.session_feedback`);
    ``session(..., observers=[...])`` chooses a session's own.
    """
    if observer not in _default_observers:
        _default_observers.append(observer)


def session(
    scheduler: str | None = None,
    *,
    cluster: str | os.PathLike[str] | None = None,
    memory_budget: int | str | None = None,
    progress: bool = True,
    observers: Sequence[Observer] | None = None,
) -> Session:
    """Run computations on a chosen scheduler, with chunk plans sized to it.

    Use as a context manager. While it is active, ``dask.compute`` and
    ``.compute()`` run on its scheduler, and :func:`daskstream.plan_chunks`
    (hence :func:`daskstream.open` with ``chunks="auto"``) plans for its memory
    budget, threads and workers. Leaving it closes the Client and cluster it
    started, leaves a cluster it only joined running, and restores the dask
    configuration and any outer session.

    Parameters
    ----------
    scheduler
        ``"threads"`` (default without ``cluster``): this process's threads.
        ``"sync"``: one task at a time in the calling thread (for debugging).
        ``"processes"``: a pool of one-thread processes, as many as CPUs.
        ``"distributed"``: a ``LocalCluster`` sized to this machine on
        127.0.0.1, started on entry and closed on exit. An address such as
        ``"tcp://10.0.0.5:8786"`` or ``"tls://..."``: a Client to that running
        scheduler.
    cluster
        A cluster YAML file (see :mod:`daskstream.runtime.clusters`): the
        cluster it describes is started or joined on entry. Cannot be combined
        with ``scheduler``. Settings in it that run code or listen beyond
        loopback are refused unless ``daskstream.cluster-files.allow-code`` /
        ``allow-network-listen`` are set in dask's configuration.
    memory_budget
        Bytes per worker (``"2GiB"``) to plan for, instead of the cluster
        file's ``daskstream: memory-budget`` or the workers' memory limit.
    progress
        Show a progress bar in :meth:`Session.compute` (needs ``tqdm``; without
        it there is no bar).
    observers
        What watches each :meth:`Session.compute`: callables taking the
        session and the objects computed and returning a context manager
        around the computation. ``None``: those registered with
        :func:`observe_computations` (the tuner's online feedback); ``[]``: none.

    Returns
    -------
    Session

    Raises
    ------
    InvalidArgumentError
        For an unknown scheduler, an address daskstream cannot join (see
        :func:`daskstream.runtime.addresses.check_scheduler_address`), both
        ``scheduler`` and ``cluster``, or a cluster file that is refused (see
        :func:`daskstream.runtime.clusters.load_cluster_config`).
    InvalidBudgetError
        For a memory budget that is not a positive size.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> import daskstream as ds
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> np.save(path, np.arange(12.0).reshape(3, 4))
    >>> with session("threads", progress=False) as s:
    ...     total, first = s.compute(ds.open(path).sum(), ds.open(path)[0])
    >>> float(total), first.tolist()
    (66.0, [0.0, 1.0, 2.0, 3.0])
    """
    return Session(scheduler, cluster=cluster, memory_budget=memory_budget, progress=progress, observers=observers)


class Session:
    """Where computations run while it is active; made by :func:`session`.

    Attributes
    ----------
    kind
        ``"sync"``, ``"threads"``, ``"processes"`` or ``"distributed"`` (also
        for an address or a cluster file).
    address
        The scheduler's address for a distributed session, once entered.
    client
        The distributed Client while active (``None`` for local schedulers).
    cluster
        The cluster object this session started, if any (``None`` when it
        joined a running scheduler or runs locally).
    memory_budget
        Bytes per worker given to the session or read from its cluster file, or ``None``.
    read_counter
        In an active ``"processes"`` session, the shared-memory counter its
        worker processes add the bytes they read to (see
        :class:`daskstream.runtime.metering.ReadMeter`); else ``None``.
    progress
        Whether :meth:`compute` shows a progress bar.
    observers
        What watches each :meth:`compute` (see :func:`session`).
    """

    def __init__(
        self,
        scheduler: str | None = None,
        *,
        cluster: str | os.PathLike[str] | None = None,
        memory_budget: int | str | None = None,
        progress: bool = True,
        observers: Sequence[Observer] | None = None,
    ) -> None:

        if scheduler is not None and cluster is not None:
            raise InvalidArgumentError(
                said(
                    "session(",
                    keyword("scheduler", scheduler),
                    ", ",
                    keyword("cluster", os.fspath(cluster)),
                    "): give one of them; the cluster file already says where work runs",
                )
            )
        if scheduler is None and cluster is None:
            scheduler = "threads"
        self._address: str | None = None
        if scheduler is not None:
            if not isinstance(scheduler, str) or (scheduler not in SCHEDULERS and "://" not in scheduler):
                choices = ", ".join(repr(s) for s in SCHEDULERS)
                raise InvalidArgumentError(
                    said(
                        keyword("scheduler", scheduler),
                        f" is not known; use one of {choices}, or the address of a running scheduler such as "
                        "'tcp://127.0.0.1:8786'",
                    )
                )
            if "://" in scheduler:
                self._address = check_scheduler_address(scheduler)
        self.scheduler = scheduler
        self.cluster_file = None if cluster is None else os.fspath(cluster)
        self.kind = scheduler if scheduler in LOCAL_SCHEDULERS else "distributed"
        self._given_budget = None if memory_budget is None else parse_budget(memory_budget)
        self.memory_budget = self._given_budget
        self.progress = bool(progress)
        self.observers: tuple[Observer, ...] = tuple(_default_observers if observers is None else observers)
        self.client: Any = None
        self.cluster: Any = None
        self.read_counter: Any = None
        self._exit_stack: contextlib.ExitStack | None = None

    @property
    def address(self) -> str | None:
        """The distributed scheduler's address (``None`` for local schedulers or before entry)."""
        if self.client is not None:
            return self.client.scheduler.address
        return self._address

    def __repr__(self) -> str:
        where = self.cluster_file or self.scheduler
        state = "active" if self._exit_stack is not None else "inactive"
        return f"<daskstream Session {where!r} ({self.kind}), {state}>"

    # -- entering and leaving ------------------------------------------------

    def __enter__(self) -> Session:
        if self._exit_stack is not None:
            raise InvalidArgumentError(f"{self!r} is already active; make a new session() to nest one")
        with contextlib.ExitStack() as stack:
            if self.kind in LOCAL_SCHEDULERS:
                stack.enter_context(dask.config.set(scheduler=self.kind))
                if self.kind == "processes":
                    self._share_read_counter(stack)
                    # One pool for the session's computations, whose workers Ctrl-C does not reach.
                    stack.enter_context(one_process_pool())
            else:
                # Entered before the Client exists: the Client's own config change is then undone
                # on its close and this one on exit, restoring whatever an outer session had set.
                stack.enter_context(dask.config.set(scheduler="dask.distributed"))
                self._start_distributed(stack)
            if self.memory_budget is not None:
                stack.enter_context(dask.config.set({"daskstream.memory-budget": self.memory_budget}))
            cap_malloc_arenas()  # the session's threads share freed memory (daskstream.compute.malloc-arenas)
            enter(self)
            stack.callback(self._deactivate)
            self._exit_stack = stack.pop_all()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:

        # Work inside the block that used the Client directly (ds.store, client.compute) fails with
        # distributed's own errors when the scheduler goes away: say what happened instead.
        lost = None
        if isinstance(exc, Exception) and self.client is not None:
            lost = lost_scheduler_error(self.client, exc, "working in the session")
        self.close()
        if lost is not None:
            raise lost from exc

    def close(self) -> None:
        """Leave the session: close what it started and restore what it changed (idempotent)."""
        stack, self._exit_stack = self._exit_stack, None
        if stack is not None:
            stack.close()

    def _share_read_counter(self, stack: contextlib.ExitStack) -> None:
        # dask starts a pool of new processes for each computation; their read counters die with
        # them, so they add to one in shared memory instead (see daskstream.runtime.metering).

        self.read_counter = shared_counter()
        then = dask.config.get("multiprocessing.initializer", None)
        stack.enter_context(
            dask.config.set({"multiprocessing.initializer": partial(process_initializer, self.read_counter, then)})
        )
        stack.callback(setattr, self, "read_counter", None)

    def _deactivate(self) -> None:
        leave(self)

    def _start_distributed(self, stack: contextlib.ExitStack) -> None:
        # Callbacks unwind last-in first-out: the Client closes before the cluster it runs on.
        from distributed import Client

        if self.cluster_file is not None:
            config = clusters.load_cluster_config(self.cluster_file)
            budget = (config.daskstream or {}).get("memory-budget")
            # "auto" in a file means what no budget means: plan for the workers' memory limit.
            if self._given_budget is None and budget not in (None, "auto"):
                self.memory_budget = parse_budget(budget)
                stack.callback(setattr, self, "memory_budget", None)  # the file is read again on re-entry
            self.client, self.cluster = clusters.connect(config)
            if self.cluster is not None:
                stack.callback(self.cluster.close)
        elif self._address is not None:
            self.client = join(self._address)
        else:
            from distributed import LocalCluster

            # LocalCluster sizes workers x threads and each worker's memory limit to this machine.
            # Without a dashboard the scheduler still serves /health on 8787 unless told otherwise;
            # a free loopback port keeps a second session from colliding with the first one's.
            with ctrl_c_kept_from_children():  # its workers are stopped by this process, not by Ctrl-C
                self.cluster = LocalCluster(
                    host="127.0.0.1", dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}
                )
            stack.callback(self.cluster.close)
            self.client = Client(self.cluster)

        stack.callback(close_client, self.client)
        if self.cluster is not None:
            # Before the client closes (callbacks run last-in first-out): the workers share this terminal.
            stack.callback(quiet_workers_when_stopped, self.client)

    # -- what the planner sees -----------------------------------------------

    def resources(self) -> Resources:
        """The memory budget, threads and workers this session offers (see the module's table).

        The budget given to the session is applied separately, through the
        ``daskstream.memory-budget`` setting, so an explicit argument to the
        planner still wins over it.
        """
        label = f"session({self.cluster_file or self.scheduler!r})"
        if self.client is not None:
            found = _client_resources(self.client)
            if found is not None:
                return Resources(found.memory_budget, found.threads, found.workers, f"{label}: {found.origin}")
        machine = machine_resources()
        if self.kind == "sync":
            return Resources(machine.memory_budget, 1, 1, f"{label}: {machine.origin}, one task at a time")
        if self.kind == "processes":
            n = int(dask.config.get("num_workers", None) or _usable_cpus())
            return Resources(machine.memory_budget // n, 1, n, f"{label}: {machine.origin}, shared by {n} process(es)")
        # "threads", or a distributed session whose workers do not report a memory limit.
        return Resources(machine.memory_budget, machine.threads, machine.workers, f"{label}: {machine.origin}")

    # -- computing -------------------------------------------------------------

    def compute(self, *objs: Any, label: str | None = None, limit: Any = None) -> Any:
        """Compute dask collections together on this session's scheduler.

        Shared inputs are read once. With ``progress`` a bar on stderr,
        labelled ``label`` (default ``"compute"`` and the sources read), counts
        the bytes read out of those planned, with the rate and the time left
        (on a cluster, the workers' reads, asked of them twice a second), and
        the tasks (output chunks on a cluster) finished beside them; where the
        reads cannot be planned it counts those alone. A computation reading one daskstream source that runs
        longer than ``daskstream.tune.feedback-min-seconds`` is recorded in the
        tuning cache by the tuner's observer (see :mod:`daskstream.tuning.session_feedback`),
        so the next :func:`daskstream.tune` of that kind of data starts from it.

        ``limit`` sets the bar's read rate beside a limit: anything with a
        ``beside(bytes_per_second) -> str`` method, such as the codec limit
        :func:`daskstream.compute.codec_limit` gives ("0.94 GB/s, 55% of zstd
        3's decode limit here").

        Returns
        -------
        A tuple of results, one per object, as ``dask.compute`` gives them
        (``(total,) = s.compute(x.sum())`` for one); numpy arrays for dask
        arrays, objects that are not dask collections as they are.

        Raises
        ------
        ClusterConnectionError
            A distributed session lost its scheduler before or during the
            computation (it stopped, or the network to it broke): raised as
            soon as the Client notices, naming the scheduler's address.
        """
        if self._exit_stack is None:
            raise InvalidArgumentError(f"{self!r}: compute inside `with session(...) as s:`")

        desc = label or _label(objs)
        to_read = planned_bytes(objs, resources_for(*objs)) if self.progress else None
        bar = None
        if self.progress:
            bar = (
                progress_bar(total=to_read, unit="B", desc=desc, unit_scale=True, unit_divisor=1024)
                if to_read
                else progress_bar(unit="task" if self.client is None else "chunk", desc=desc)
            )
        try:
            with contextlib.ExitStack() as watching:
                for observer in self.observers:
                    watching.enter_context(observer(self, objs))
                if self.client is not None:
                    results = self._compute_distributed(objs, bar, counts_bytes=bool(to_read), limit=limit)
                elif bar is not None and to_read:
                    with ReadMeter(self) as meter, ReadProgress(bar, meter.so_far, limit) as progress:
                        results = dask.compute(*objs, scheduler=self.kind)
                    progress.show()
                else:
                    with TaskProgress(bar) if bar is not None else contextlib.nullcontext():
                        results = dask.compute(*objs, scheduler=self.kind)
        finally:
            if bar is not None:
                bar.close()
        return tuple(results)

    def _compute_distributed(
        self, objs: tuple[Any, ...], bar: Any, *, counts_bytes: bool = False, limit: Any = None
    ) -> tuple[Any, ...]:
        from distributed import futures_of
        from distributed import wait as wait_for

        # Without the guard, a lost scheduler surfaces as cancelled futures, or as calls that
        # wait for the Client's reconnection timeout before failing.
        with guard_scheduler(self.client, _described(objs)):
            if bar is None:
                return tuple(self.client.gather(self.client.compute(list(objs))))
            client = self.client
            # Persist first so the bar can follow every output chunk, then assemble them. The futures are
            # followed half a second at a time, so that a lost scheduler is noticed within that, never
            # only when the Client's reconnection times out.
            with ReadMeter(self) if counts_bytes else contextlib.nullcontext() as meter:
                persisted = [client.persist(obj) if dask.is_dask_collection(obj) else obj for obj in objs]
                futures = futures_of(persisted)
                if meter is None:
                    bar.total += len(futures)
                    bar.refresh()
                pending = list(futures)
                started = time.perf_counter()
                while pending and not scheduler_lost(client):
                    with contextlib.suppress(TimeoutError):  # not all done within the half second
                        wait_for(pending, timeout=0.5, return_when="FIRST_COMPLETED")
                    still = [future for future in pending if not future.done()]
                    finished, pending = len(pending) - len(still), still
                    if meter is None:
                        bar.update(finished)
                    else:
                        # The bytes the workers' sources deliver, asked of them as the futures are followed:
                        # the bar moves with every block read, also while one output chunk is being reduced.
                        read = meter.so_far()
                        done = f"{len(futures) - len(pending)}/{len(futures)} chunks"
                        bar.set_postfix_str(done + rate_beside(limit, read, started), refresh=False)
                        bar.update(max(min(read, bar.total) - bar.n, 0))
                if scheduler_lost(client):
                    raise ConnectionError("the scheduler was lost while the results were computed")
            return tuple(client.gather(client.compute(persisted)))


def _label(objs: tuple[Any, ...]) -> str:
    """A progress bar's label: ``"compute x.npy, y.h5"`` (the first sources read), else ``"compute"``."""
    shown = _sources_shown(objs)
    return f"compute {shown}" if shown else "compute"


def _described(objs: tuple[Any, ...]) -> str:
    """What a computation does, for messages: ``"computing 1 result(s) from x.npy, y.h5"``."""
    shown = _sources_shown(objs)
    return f"computing {len(objs)} result(s)" + (f" from {shown}" if shown else "")


def _sources_shown(objs: tuple[Any, ...]) -> str:
    """The sources ``objs`` read, the first three by name (``"x.npy, y.h5 and 2 more"``); ``""`` for none."""
    names: list[str] = []
    for obj in objs:
        if dask.is_dask_collection(obj):
            with contextlib.suppress(Exception):
                names += [source.name for _, source, _ in read_layers(obj) if source.name not in names]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
