"""A cluster file as read: its kind and settings, and what checking it found."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daskstream.runtime.versions import ClusterVersions


@dataclass(frozen=True)
class ClusterConfig:
    """A cluster configuration file, read and screened but not acted on.

    Attributes
    ----------
    path
        The YAML file.
    kind
        One of :data:`daskstream.runtime.clusters.KINDS`, from the file's ``daskstream.cluster`` key.
    settings
        The whole YAML document, shaped like dask configuration (dotted keys
        such as ``"distributed.worker.memory": ...`` spread into sections).
    allow_code
        Whether settings that run code were allowed when the file was loaded.
    allow_network_listen
        Whether listening beyond loopback was allowed when the file was loaded.
    """

    path: Path
    kind: str
    settings: dict
    allow_code: bool = False
    allow_network_listen: bool = False

    @property
    def daskstream(self) -> dict:
        """The ``daskstream:`` section (``{}`` when the file has none)."""
        return self.settings.get("daskstream") or {}


@dataclass(frozen=True)
class ClusterCheck:
    """What :func:`~daskstream.runtime.clusters.connect` would do with a configuration, found without starting anything.

    Attributes
    ----------
    kind
        The kind of cluster.
    lines
        A human summary, one fact per line.
    job_script
        For ``slurm`` and ``pbs``: the batch script dask-jobqueue would submit per job.
    spec
        For ``kubernetes``: the ``DaskCluster`` resource the operator would be given.
    versions
        What the running cluster's scheduler and workers import, beside this
        client's (:func:`~daskstream.runtime.clusters.check_cluster`); ``None``
        when nothing running was asked.
    """

    kind: str
    lines: list[str]
    job_script: str | None = None
    spec: dict | None = field(default=None)
    versions: ClusterVersions | None = None


def leaves(settings: Mapping, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every setting of a sectioned mapping as ``("a.b.c", value)``."""
    # dask.config.set replaces a whole section given as a dict; dotted leaves keep its other defaults.
    # Recursion is bounded: documents are read no deeper than documents.MAX_DEPTH.
    for key, value in settings.items():
        if isinstance(value, Mapping) and value:
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def lookup(settings: Mapping, dotted: str) -> Any:
    """The value of setting ``"a.b.c"`` in a sectioned mapping, ``None`` where it is not set."""
    value: Any = settings
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


__all__ = ["ClusterCheck", "ClusterConfig", "leaves", "lookup"]
