"""Which daskstream, dask, distributed and numpy the client, the scheduler and every worker import.

With a distributed Client, dask (2025 and later) builds and optimizes each
graph in the scheduler's process, so daskstream's optimizer
(:func:`daskstream.graph.optimize.optimize`) runs there, with the scheduler's
daskstream and dask, and the tasks it plans run with the workers'. A scheduler
or worker that cannot import daskstream, or imports another version, fails
late (a task that cannot be unpickled, a plan made by other code than the one
that checked it) and far from the cause. :func:`check_cluster_versions` asks
each process once, when daskstream joins a cluster, and raises one
:class:`~daskstream.errors.ClusterVersionError` naming every process that
differs, what it has and what to install.

What must agree: daskstream, dask and distributed exactly (distributed
itself warns when its processes differ in them); numpy by major version,
across which pickled arrays and dtype promotion differ.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from daskstream.errors import ClusterVersionError

if TYPE_CHECKING:
    import distributed

__all__ = ["COMPARED", "ClusterVersions", "ProcessVersions", "ask_versions", "check_cluster_versions", "this_process"]

#: The packages compared, in the order lines and messages list them.
COMPARED = ("daskstream", "dask", "distributed", "numpy")

# Compared by major version only; the others must be the same release.
_BY_MAJOR = frozenset({"numpy"})

# Workers named one by one in a message before the rest are counted.
_NAMED_WORKERS = 3


@dataclass(frozen=True)
class ProcessVersions:
    """What one process imports.

    Attributes
    ----------
    role
        ``"client"``, ``"scheduler"`` or ``"worker"``.
    address
        The scheduler's or worker's address; ``""`` for the client.
    versions
        Package name to the ``__version__`` of the module the process imports,
        ``None`` where it cannot import it.
    failures
        Package name to why the process cannot import it (``"ModuleNotFoundError: ..."``).
    unanswered
        Why the process did not say what it imports; ``None`` when it did.
    """

    role: str
    address: str
    versions: Mapping[str, str | None]
    failures: Mapping[str, str]
    unanswered: str | None = None

    @property
    def name(self) -> str:
        """How messages name the process: ``"scheduler tcp://..."``, ``"worker tcp://..."``, ``"this client"``."""
        return "this client" if self.role == "client" else f"{self.role} {self.address}"

    def as_dict(self) -> dict[str, Any]:
        """The process's address, versions and what it could not import, for JSON."""
        return {
            "address": self.address or None,
            "versions": dict(self.versions),
            "failures": dict(self.failures),
            "unanswered": self.unanswered,
        }


@dataclass(frozen=True)
class ClusterVersions:
    """What this client, the scheduler and each worker import, compared.

    Attributes
    ----------
    address
        The scheduler's address.
    client
        This process's versions.
    scheduler
        The scheduler's.
    workers
        Each worker's, in the order of their addresses (only those connected when asked).
    """

    address: str
    client: ProcessVersions
    scheduler: ProcessVersions
    workers: tuple[ProcessVersions, ...]

    def differences(self) -> list[str]:
        """One phrase per group of processes that differ from this client in the same way, scheduler first.

        Empty when every process imports what this client does.
        """
        groups: dict[tuple[str, str], list[ProcessVersions]] = {}
        for process in (self.scheduler, *self.workers):
            phrase = ", ".join(phrase for _, phrase in self._differing(process))
            if phrase:
                groups.setdefault((process.role, phrase), []).append(process)
        return [f"{_names(processes)}: {phrase}" for (_, phrase), processes in groups.items()]

    def lines(self) -> list[str]:
        """A table for people: a row for this client, the scheduler, and each group of workers alike."""
        header = ["versions", *COMPARED]
        rows = [self._row(self.client, self.client.name), self._row(self.scheduler, self.scheduler.name)]
        alike: dict[tuple[Any, ...], list[ProcessVersions]] = {}
        for worker in self.workers:
            alike.setdefault((tuple(worker.versions.items()), worker.unanswered), []).append(worker)
        for workers in alike.values():
            rows.append(self._row(workers[0], workers[0].name if len(workers) == 1 else f"{len(workers)} workers"))
        table = [header, *rows]
        # A process that did not answer has one cell after its label, as wide as it needs: not a column's width.
        widths = [max(len(row[i]) for row in table if i == 0 or len(row) == len(header)) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in table]
        if not self.workers:
            lines.append("no workers have joined yet: only the scheduler was compared")
        return lines

    def as_dict(self) -> dict[str, Any]:
        """Every process's versions and the differences found, for JSON."""
        return {
            "address": self.address,
            "client": self.client.as_dict(),
            "scheduler": self.scheduler.as_dict(),
            "workers": [worker.as_dict() for worker in self.workers],
            "differences": self.differences(),
        }

    def check(self) -> None:
        """Raise :class:`~daskstream.errors.ClusterVersionError` when any process differs from this client.

        Raises
        ------
        ClusterVersionError
            One line: each process (or group of workers) that differs and what
            it has, then the versions to install on the scheduler and workers.
        """
        differences = self.differences()
        if not differences:
            return
        differing = {name for process in (self.scheduler, *self.workers) for name, _ in self._differing(process)}
        pins = ", ".join(
            f"{name}=={self.client.versions[name]}" for name in COMPARED if name in differing or name == "daskstream"
        )
        raise ClusterVersionError(
            f"{'; '.join(differences)}. daskstream plans each computation in the scheduler's process and runs its "
            f"tasks in the workers': install this client's {pins} on the scheduler and every worker of "
            f"{self.address} and restart them (daskstream cluster check {self.address} compares again)"
        )

    def _differing(self, process: ProcessVersions) -> list[tuple[str | None, str]]:
        """``(package, phrase)`` for each way ``process`` differs from this client (package ``None``: no answer)."""
        if process.unanswered is not None:
            return [(None, f"did not say what it imports ({process.unanswered})")]
        found: list[tuple[str | None, str]] = []
        for name in COMPARED:
            ours, theirs = self.client.versions.get(name), process.versions.get(name)
            if ours is None:
                continue  # nothing here to compare with
            if theirs is None:
                found.append((name, f"{name} not importable{_why(name, process.failures.get(name))}"))
            elif not _agree(name, ours, theirs):
                found.append((name, f"{name} {theirs} vs this client's {ours}"))
        return found

    @staticmethod
    def _row(process: ProcessVersions, label: str) -> list[str]:
        if process.unanswered is not None:
            return [label, f"did not answer ({process.unanswered})"]
        return [label, *(process.versions.get(name) or "not importable" for name in COMPARED)]


def ask_versions(client: distributed.Client) -> ClusterVersions:
    """What this process, ``client``'s scheduler and each of its workers import, without comparing.

    One call to the scheduler and one to all workers. A process that fails
    to answer is recorded with why, not raised.
    """
    probe = _version_probe(COMPARED)
    address = client.scheduler.address
    try:
        scheduler = _answered("scheduler", address, client.run_on_scheduler(probe))
    # Whatever the scheduler raised while answering comes back as itself, of any type: it is what it has.
    except Exception as exc:
        scheduler = ProcessVersions("scheduler", address, {}, {}, unanswered=_said(exc))
    answers = client.run(probe, on_error="return")
    workers = tuple(
        ProcessVersions("worker", worker, {}, {}, unanswered=_said(answer))
        if isinstance(answer, BaseException)
        else _answered("worker", worker, answer)
        for worker, answer in sorted(answers.items())
    )
    return ClusterVersions(address, this_process(), scheduler, workers)


def check_cluster_versions(client: distributed.Client) -> ClusterVersions:
    """:func:`ask_versions`, then raise where the scheduler or a worker differs from this client.

    Raises
    ------
    ClusterVersionError
        See :meth:`ClusterVersions.check`.
    """
    found = ask_versions(client)
    found.check()
    return found


def this_process() -> ProcessVersions:
    """What this process imports.

    >>> this_process().versions["daskstream"] == __import__("daskstream").__version__
    True
    """
    return _answered("client", "", _version_probe(COMPARED)())


def _version_probe(packages: tuple[str, ...]) -> Callable[[], dict[str, list[str | None]]]:
    """A function that says, for each of ``packages``, ``[version, None]`` or ``[None, why not importable]``.

    Made here rather than written at the top of the module: distributed sends
    a nested function by value (cloudpickle), so a process without daskstream,
    or with another version of this module, runs it as sent. It needs nothing
    but the standard library there.
    """

    def imported_versions() -> dict[str, list[str | None]]:
        found: dict[str, list[str | None]] = {}
        for name in packages:
            try:
                found[name] = [str(importlib.import_module(name).__version__), None]
            # A package that fails to import in any way (missing, or broken beside its dependencies) is what
            # this process has: said, not raised.
            except Exception as exc:
                found[name] = [None, f"{type(exc).__name__}: {exc}"]
        return found

    return imported_versions


def _answered(role: str, address: str, answer: Any) -> ProcessVersions:
    """The probe's ``answer`` from one process, read defensively: it comes from another program."""
    if not isinstance(answer, Mapping):
        return ProcessVersions(role, address, {}, {}, unanswered=f"it answered {type(answer).__name__}")
    versions: dict[str, str | None] = {}
    failures: dict[str, str] = {}
    for name in COMPARED:
        entry = answer.get(name)
        version, failure = entry if isinstance(entry, list | tuple) and len(entry) == 2 else (None, None)
        versions[name] = None if version is None else str(version)
        if version is None:
            failures[name] = str(failure or "not reported")
    return ProcessVersions(role, address, versions, failures)


def _agree(name: str, ours: str, theirs: str) -> bool:
    if name not in _BY_MAJOR:
        return ours == theirs
    try:
        return Version(ours).major == Version(theirs).major
    except InvalidVersion:
        return ours.split(".")[0] == theirs.split(".")[0]


def _why(name: str, failure: str | None) -> str:
    """Why ``name`` cannot be imported, for a message; nothing when it is simply not installed."""
    if failure is None or failure == f"ModuleNotFoundError: No module named '{name}'":
        return ""
    return f" ({failure if len(failure) <= 200 else failure[:197] + '...'})"


def _said(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "no message"
    return f"{type(exc).__name__}: {text if len(text) <= 200 else text[:197] + '...'}"


def _names(processes: list[ProcessVersions]) -> str:
    """``"scheduler tcp://a"``, ``"worker tcp://b"``, ``"workers tcp://b, tcp://c and 4 more"``."""
    if len(processes) == 1:
        return processes[0].name
    role = f"{processes[0].role}s"
    shown = ", ".join(p.address for p in processes[:_NAMED_WORKERS])
    rest = len(processes) - _NAMED_WORKERS
    return f"{role} {shown}" + (f" and {rest} more" if rest > 0 else "")
