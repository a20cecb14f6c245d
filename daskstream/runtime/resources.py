"""What the planner may assume about the place a computation runs.

Precedence for the memory budget and thread counts: an explicit argument,
then the setting ``daskstream.memory-budget`` when it is not ``"auto"`` (an
active :func:`daskstream.session` with a budget sets it), then the active
session's place (its workers, or this machine as its scheduler uses it), then
the active distributed Client's workers, then this machine.

:func:`resolve_settings` is called once where a call enters daskstream: it
adds the ``daskstream.planning.*`` settings and returns the frozen
:class:`~daskstream.planning.settings.PlanSettings` that everything below
(the planner, sources, graph rewrites) receives.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import sys
from typing import TYPE_CHECKING

import dask.config
import psutil
from dask.system import cpu_count

from daskstream import config
from daskstream.planning.budget import format_size, parse_budget
from daskstream.planning.settings import PlanSettings, Resources
from daskstream.runtime.schedulers import current, scheduler_kind

if TYPE_CHECKING:
    from distributed import Client

_MiB = 2**20


def resolve_resources(
    *, memory_budget: int | str | None = None, threads: int | None = None, workers: int | None = None
) -> Resources:
    """The budget and parallelism to plan for: arguments first, then config, the Client, the machine.

    Examples
    --------
    >>> resolve_resources(memory_budget="1GiB", threads=2, workers=1)
    Resources(memory_budget=1073741824, threads=2, workers=1, origin='arguments')
    """
    budget = config.get("memory-budget", memory_budget)
    if budget != "auto" and threads is not None and workers is not None:
        return Resources(parse_budget(budget), threads, workers, origin="arguments")
    found = detect_resources()
    return Resources(
        memory_budget=found.memory_budget if budget == "auto" else parse_budget(budget),
        threads=found.threads if threads is None else threads,
        workers=found.workers if workers is None else workers,
        origin=found.origin,
    )


def resolve_settings(
    *,
    memory_budget: int | str | None = None,
    threads: int | None = None,
    workers: int | None = None,
    target_chunk_bytes: int | str | None = None,
    working_set_factor: float | None = None,
    min_tasks_per_thread: int | None = None,
) -> PlanSettings:
    """Everything a plan takes besides the array, resolved here and now: arguments first, then settings.

    Resources come from :func:`resolve_resources`; the planner's settings from
    ``daskstream.planning.*`` (``target-chunk-bytes: auto`` sized to the CPU
    cache, ``working-set-factor: auto`` from the dtype and ``float64-copies``).

    Examples
    --------
    >>> settings = resolve_settings(memory_budget="1GiB", threads=2, workers=1, target_chunk_bytes="4MiB")
    >>> settings.memory_budget, settings.threads, settings.target_chunk_bytes
    (1073741824, 2, 4194304)
    """
    resources = resolve_resources(memory_budget=memory_budget, threads=threads, workers=workers)
    target = config.get("planning.target-chunk-bytes", target_chunk_bytes)
    factor = config.get("planning.working-set-factor", working_set_factor)
    return PlanSettings(
        resources=dataclasses.replace(resources, threads_share_process=scheduler_kind() == "threads"),
        target_chunk_bytes=cache_sized_chunk_bytes()
        if target == "auto"
        else parse_budget(target, name="target_chunk_bytes"),
        working_set_factor=None if factor == "auto" else float(factor),
        float64_copies=config.setting("planning.float64-copies"),
        min_tasks_per_thread=config.setting("planning.min-tasks-per-thread", min_tasks_per_thread),
        max_tasks=config.setting("planning.max-tasks"),
        object_store_task_bytes=parse_budget(config.get("objects.task-bytes"), name="daskstream.objects.task-bytes"),
    )


def detect_resources() -> Resources:
    """Resources of the active session, else of the active distributed Client, else of this machine."""
    active = current()
    if active is not None:
        return active.resources()
    return _client_resources() or machine_resources()


def machine_resources() -> Resources:
    """A share of this machine's available memory and its usable CPUs."""
    fraction = config.setting("planning.machine-memory-fraction")
    budget = int(psutil.virtual_memory().available * fraction)
    threads = dask.config.get("num_workers", None) or _usable_cpus()
    return Resources(
        memory_budget=budget,
        threads=int(threads),
        workers=1,
        origin=f"this machine ({fraction:.0%} of available memory, {threads} CPU(s))",
    )


def _usable_cpus() -> int:
    """CPUs this process may use: the fewest of the machine's, its affinity and its cgroup's quota."""
    return max(1, cpu_count())


def _client_resources(client: Client | None = None) -> Resources | None:
    """Resources of ``client``'s workers (by default the active Client); ``None`` when unknown."""
    if client is None:
        # Only a program that imported distributed can have a Client; do not import it for nothing.
        if "distributed" not in sys.modules:
            return None
        from distributed import default_client

        try:
            client = default_client()
        except ValueError:
            return None
    if client.status != "running":
        return None
    workers = list(client.scheduler_info(n_workers=-1)["workers"].values())
    if not workers or not all(w.get("memory_limit") for w in workers):
        return None
    fraction = worker_memory_fraction()
    limit = min(w["memory_limit"] for w in workers)
    # What an idle worker already holds (the interpreter, the libraries, its caches) is not
    # the tasks' to use: the thresholds act on the whole process.
    baseline = max(int(w.get("metrics", {}).get("memory") or 0) for w in workers)
    floor = limit // 8
    budget = max(min(int(w["memory_limit"] * fraction) for w in workers) - baseline, floor)
    threads = min(w["nthreads"] for w in workers)
    origin = (
        f"the distributed Client at {client.scheduler.address}: {fraction:.0%} of the workers' memory limit "
        f"({format_size(limit)}) less the {format_size(baseline)} an idle worker holds"
    )
    if budget == floor:
        origin += f"; that leaves less than {format_size(floor)}, so 1/8 of the limit (expect spilling)"
    return Resources(memory_budget=budget, threads=threads, workers=len(workers), origin=origin)


def worker_memory_fraction() -> float:
    """The share of a worker's memory limit tasks may fill before distributed acts.

    The lowest of distributed's enabled worker memory thresholds: ``target``
    (start spilling stored results to disk), ``spill`` (spill on process
    memory) and ``pause`` (stop running tasks); 0.6 by default. This process's
    dask configuration is read: it is the workers' own for a cluster started
    from here.

    Examples
    --------
    >>> import dask.config
    >>> with dask.config.set({"distributed.worker.memory.target": False, "distributed.worker.memory.spill": 0.85}):
    ...     worker_memory_fraction()
    0.8
    """
    import distributed.config  # noqa: F401  (its defaults enter dask.config on import)

    thresholds = [dask.config.get(f"distributed.worker.memory.{name}", None) for name in ("target", "spill", "pause")]
    enabled = [float(t) for t in thresholds if t not in (None, False)]
    return min(enabled, default=1.0)


@functools.cache
def last_level_cache_bytes() -> int | None:
    """Size of the CPU's largest cache, from sysfs; ``None`` where unknown."""
    sizes = []
    for entry in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip()
        try:
            sizes.append(int(text[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}[text[-1]])
        except (KeyError, ValueError):
            continue
    return max(sizes, default=None)


def cache_sized_chunk_bytes() -> int:
    """A quarter of the last-level cache, clamped to [4 MiB, 16 MiB].

    A chunk that size is still in cache when the op runs over it right after
    the read; measured on a 32 MiB-L3 machine, 4-16 MiB chunks reduce a warm
    .npy about twice as fast as 128 MiB ones. The upper bound holds on CPUs
    with far larger shared caches too: a task's buffer of 32 MiB or more is
    always a fresh memory map from glibc (its largest mmap threshold), faulted
    in and zeroed page by page on every task, while smaller ones reuse the
    heap. Measured on a 260 MiB-L3 machine with 2 cores: summing a warm 1 GiB
    .npy takes 0.24 s in 16 MiB tasks, 0.36 s in 32 MiB and 0.41 s in 64 MiB.
    Unknown caches get 8 MiB.
    """
    llc = last_level_cache_bytes()
    if llc is None:
        return 8 * _MiB
    return min(max(llc // 4, 4 * _MiB), 16 * _MiB)
