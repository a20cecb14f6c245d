"""What an adaptive run tried, chose and why: the record :mod:`daskstream.tuning.adaptive` returns."""

from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass
from typing import Any

from daskstream.planning.budget import format_size


@dataclass(frozen=True)
class Tried:
    """What one setting did in an adaptive run.

    Attributes
    ----------
    role, chunks, chunk_bytes, threads
        The setting (see :class:`daskstream.tuning.adaptive.trials.Setting`).
    waves
        Waves it ran (trials, and the rest when it won).
    nbytes, seconds
        Bytes its waves covered and the time they took.
    throughput
        Median bytes per second of its trial waves.
    spread
        The noise of its trials (half their range over the median).
    """

    role: str
    chunks: tuple[int, ...]
    chunk_bytes: int
    threads: int
    waves: int
    nbytes: int
    seconds: float
    throughput: float | None
    spread: float


@dataclass(frozen=True)
class Adaptation:
    """What an adaptive run tried, chose and why.

    Attributes
    ----------
    source, operation
        What was computed.
    nbytes
        The array's bytes (all read once).
    tried
        One row per setting; the first is the one started from.
    chosen
        Index in ``tried`` of the setting the rest ran with.
    reason
        Why it was chosen, or why nothing was tried.
    trial_bytes, trial_seconds
        Bytes the trial waves covered, and the time they took.
    seconds
        The whole run.
    started_from
        ``"planner"`` or where a remembered setting came from.
    adapted
        False when the run went as planned without trials (``reason`` says why).
    cluster
        The distributed cluster the run went to (its kind, address and size:
        ``"LocalCluster at tcp://127.0.0.1:40213 (2 workers x 1 thread)"``),
        where ``threads`` are the tasks it had in flight; ``None`` on this
        process's threads.
    """

    source: str
    operation: str
    nbytes: int
    tried: tuple[Tried, ...]
    chosen: int
    reason: str
    trial_bytes: int
    trial_seconds: float
    seconds: float
    started_from: str
    adapted: bool
    cluster: str | None = None

    @property
    def chunks(self) -> tuple[int, ...]:
        """The chunk shape the rest ran with."""
        return self.tried[self.chosen].chunks

    @property
    def threads(self) -> int:
        return self.tried[self.chosen].threads

    @property
    def trial_cost_seconds(self) -> float:
        """Time the trials took beyond what their bytes would have taken with the winner."""
        winner = self.tried[self.chosen]
        if not self.adapted or not winner.throughput:
            return 0.0
        return max(0.0, self.trial_seconds - self.trial_bytes / winner.throughput)

    def explain(self) -> str:
        """The run for people: what was tried, on how much of the data, what won and why."""
        on = "" if self.cluster is None else f" on {self.cluster}"
        lines = [f"adaptive {self.operation} over {self.source} ({format_size(self.nbytes)}){on}, {self.seconds:.2f} s"]
        # On a cluster, a setting's threads are the tasks it has in flight there.
        threads = "threads" if self.cluster is None else "in flight"
        if not self.adapted:
            lines.append(f"  ran as planned: {self.reason}")
            row = self.tried[0]
            lines.append(f"  {row.chunks}, {format_size(row.chunk_bytes)} x {row.threads} {threads}")
            return "\n".join(lines)
        share = self.trial_bytes / self.nbytes if self.nbytes else 0.0
        lines.append(
            f"  tried on the first {share:.0%} of the array ({format_size(self.trial_bytes)}), interleaved, "
            f"starting from the {self.started_from}:"
        )
        width = max(len(t.role) for t in self.tried)
        for i, t in enumerate(self.tried):
            speed = "-" if t.throughput is None else f"{t.throughput / 1e9:.2f} GB/s ± {t.spread:.0%}"
            mark = "  <- chosen" if i == self.chosen else ""
            lines.append(
                f"    {t.role:<{width}}  {t.chunks!s:<16} {format_size(t.chunk_bytes):>10} x {t.threads:>2} {threads}"
                f"  {speed}{mark}"
            )
        lines.append(f"  {self.reason}; the rest ran with it")
        lines.append(f"  trials cost {self.trial_cost_seconds:.2f} s beyond running their rows with the choice")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<daskstream Adaptation\n{self.explain()}>"

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.explain())}</pre>"

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for ``--json``)."""
        out = dataclasses.asdict(self)
        out["tried"] = [dataclasses.asdict(t) for t in self.tried]
        out["chunks"] = list(self.chunks)
        out["threads"] = self.threads
        out["trial_cost_seconds"] = self.trial_cost_seconds
        return out
