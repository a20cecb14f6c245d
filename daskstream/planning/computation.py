"""What a whole computation will do and hold: its passes over the data and its projected memory.

:class:`ComputePlan` is what :func:`daskstream.plan_compute` returns and what
daskstream checks before every computation over its sources: the passes (from
:mod:`daskstream.planning.passes`), the task that holds the most at its peak
with its memory term by term (:class:`TaskMemory`, as cubed projects each
operation), and what stays in memory between tasks. A plan whose projected
peak exceeds the budget raises :class:`~daskstream.errors.MemoryBudgetError`
before a byte is read.

>>> task = TaskMemory("read x.npy -> sum", (("input", 4 << 20), ("output", 8)), level=0)
>>> plan = ComputePlan(
...     budget=64 << 20, concurrency=2, tasks=10, passes=1, read_passes={"x.npy": (0,)},
...     source_bytes={"x.npy": 40 << 20}, pass_work={0: ("sum",)}, worst=task, held=(),
... )
>>> plan.projected_peak_bytes == 2 * task.peak_bytes
True
>>> plan.check()  # within the budget: nothing raised
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from daskstream.advice import named, said
from daskstream.errors import MemoryBudgetError
from daskstream.planning.budget import format_size
from daskstream.planning.cards import card_of

# The names of a task's memory terms, in the order they are reported.
TERMS = ("input", "decoded copy", "halo", "intermediate", "workspace", "output")


@dataclass(frozen=True)
class TaskMemory:
    """The projected peak of one task, term by term.

    Attributes
    ----------
    operation
        What the task does, in order (``"read field.npy -> sub -> moments_chunk"``).
    terms
        ``(name, bytes)`` at the task's peak, ``name`` one of :data:`TERMS`:
        ``input`` (blocks it reads or receives), ``decoded copy`` (a storage
        chunk as stored and decoded, while it is read), ``halo`` (cells borrowed
        beyond its block), ``intermediate`` (results of earlier steps of the
        task still held), ``workspace`` (an operation's temporaries) and
        ``output`` (what the current step makes).
    level
        The pass the task runs in (from 0).
    """

    operation: str
    terms: tuple[tuple[str, int], ...]
    level: int = 0

    @property
    def peak_bytes(self) -> int:
        return sum(n for _, n in self.terms)

    def describe(self) -> str:
        """The terms in human units: ``input 4.00 MiB + output 8 B``."""
        shown = [f"{name} {format_size(n)}" for name, n in self.terms if n]
        return " + ".join(shown) or "nothing"


@dataclass(frozen=True)
class Spans:
    """Tasks streaming spans of many chunks each (:mod:`daskstream.planning.spans`).

    Attributes
    ----------
    tasks
        Tasks the scheduler runs.
    chunks
        Chunks the largest span holds.
    chunk_bytes
        Bytes of the largest chunk: the buffer a task reads into, one at a time.
    """

    tasks: int
    chunks: int
    chunk_bytes: int

    def line(self) -> str:
        """For :meth:`ComputePlan.explain`.

        >>> Spans(tasks=49_548, chunks=57, chunk_bytes=760 * 2**20).line().split(": ", 1)[1][:63]
        'the scheduler runs 49,548 tasks, each streaming up to 57 chunks'
        """
        return (
            f"Spans: the scheduler runs {self.tasks:,} tasks, each streaming up to {self.chunks:,} chunks of its "
            f"span one after another through a buffer of one chunk ({format_size(self.chunk_bytes)}); the "
            "projection above is of one chunk's work"
        )


@dataclass(frozen=True)
class Streaming:
    """The blocks' work of a computation run in streaming tasks, a chain of a block's tasks at a time each.

    Attributes
    ----------
    streams
        Streaming tasks.
    folded
        Tasks of the graph dask built that run inside them.
    tasks
        Tasks the scheduler runs, streaming tasks included.
    ahead
        Blocks each streaming task reads ahead of the one it works on.
    shared
        Tasks giving what the streaming tasks share (a layer whose blocks
        they compute), counted in ``tasks`` but not work dask would have run.
    """

    streams: int
    folded: int
    tasks: int
    ahead: int = 0
    shared: int = 0

    def line(self) -> str:
        """For :meth:`ComputePlan.explain`.

        >>> Streaming(streams=8, folded=3900, tasks=20).line().split("; ")[1]
        'the scheduler runs 20 tasks (3,912 without)'
        """
        pace = (
            f"each reading {self.ahead} ahead of the chain it works on" if self.ahead else "one chain at a time in each"
        )
        return (
            f"Streaming: {self.folded:,} tasks of the blocks' work run inside {self.streams:,} streaming tasks, "
            f"{pace}; the scheduler runs {self.tasks:,} tasks "
            f"({self.tasks - self.streams - self.shared + self.folded:,} without)"
        )


@dataclass(frozen=True)
class ComputePlan:
    """How a computation reading daskstream sources will run, and what it will hold.

    Attributes
    ----------
    budget
        Bytes one worker may use.
    concurrency
        Tasks a worker runs at once.
    tasks
        Tasks in the computation, after fusion's planning (an upper bound).
    passes
        Passes over the data: the most times any source is read in all.
    read_passes
        For each source, the passes (from 0) that read it.
    source_bytes
        Each source's size.
    reads
        How many times each source is read in all: once per pass, unless work
        that reads it with halos and work that reads it without run in one pass
        (they read it separately). Empty: once per pass.
    read_again
        How many times over, beyond ``reads``, each source is read by
        indices with positions in no order over spans (each piece of the
        source once per piece of the result it feeds; on average, rounded
        to no whole number).
    pass_work
        For each pass (by its level, from 0), what its tasks do with the blocks they read.
    worst
        The task that holds the most at its peak.
    held
        ``(what, bytes)`` kept in memory between tasks: aggregates that later
        passes take whole, blocks waiting for a second consumer.
    max_tasks
        Tasks whose graph the client and scheduler may hold at once, as the
        arrays were planned (``None``: no ceiling).
    limits
        What this machine's codec limits are for the sources read, as far as
        they are known (remembered from an earlier measurement): one line each.
    routes
        Where an operation has an in-memory and an out-of-core way (an exact
        quantile), which one it takes and why: one line each.
    streaming
        How the blocks' work runs in streaming tasks
    spans
        How tasks stream the spans of arrays read in spans
        (:mod:`daskstream.compute.streaming`), where it does.
    pieces
        For each source whose blocks are read a piece of storage chunks at
        a time, each piece reduced while in the cache
        (:mod:`daskstream.compute.streaming.chunkwise`), a piece's bytes.
    """

    budget: int
    concurrency: int
    tasks: int
    passes: int
    read_passes: Mapping[str, tuple[int, ...]]
    source_bytes: Mapping[str, int]
    pass_work: Mapping[int, tuple[str, ...]]
    worst: TaskMemory | None
    held: tuple[tuple[str, int], ...] = field(default=())
    reads: Mapping[str, int] = field(default_factory=dict)
    read_again: Mapping[str, float] = field(default_factory=dict)
    max_tasks: int | None = None
    limits: tuple[str, ...] = ()
    routes: tuple[str, ...] = ()
    streaming: Streaming | None = None
    spans: Spans | None = None
    pieces: Mapping[str, int] = field(default_factory=dict)

    @property
    def held_bytes(self) -> int:
        return sum(n for _, n in self.held)

    @property
    def projected_peak_bytes(self) -> int:
        """``concurrency`` of the largest tasks at once, and what is held between tasks."""
        worst = self.worst.peak_bytes if self.worst is not None else 0
        return self.concurrency * worst + self.held_bytes

    def times_read(self, source: str) -> int:
        """How many times ``source`` is read in all."""
        return max(self.reads.get(source, 0), len(self.read_passes.get(source, ())))

    @property
    def bytes_to_read(self) -> int:
        """Bytes read from the sources, in all (halos aside)."""
        return sum(
            round((self.times_read(source) + self.read_again.get(source, 0.0)) * self.source_bytes.get(source, 0))
            for source in self.read_passes
        )

    def check(self) -> None:
        """Raise :class:`MemoryBudgetError` when the projected peak exceeds the budget, or the tasks the ceiling."""
        refuse_beyond_ceiling(self.tasks, self.max_tasks, self.budget, "has")
        if self.projected_peak_bytes <= self.budget or self.worst is None:
            return
        held = f" + {format_size(self.held_bytes)} held between tasks" if self.held_bytes else ""
        raise MemoryBudgetError(
            said(
                f"this computation projects {format_size(self.projected_peak_bytes)} per worker, over its memory "
                f"budget of {format_size(self.budget)}: {self.concurrency} task(s) at once of "
                f"{format_size(self.worst.peak_bytes)} ({self.worst.operation}: {self.worst.describe()}){held}. "
                "Open the data with a larger ",
                named("memory_budget"),
                " or smaller chunks (ds.open(..., chunks=...)), or run fewer threads",
            )
        )

    def _repr_html_(self) -> str | None:
        """The plan as an HTML card, for notebooks: drawn when asked by :mod:`daskstream.views`."""
        return card_of(self)

    def explain(self) -> str:
        """Plain-text account: the passes, what each reads and computes, and the projected memory."""
        sources = ", ".join(f"{name} ({format_size(n)})" for name, n in self.source_bytes.items()) or "nothing"
        lines = [
            f"Computation over {sources}: {self.tasks} task(s), {self.concurrency} at a time, "
            f"budget {format_size(self.budget)} per worker",
            f"Passes over the data: {self.passes} ({format_size(self.bytes_to_read)} read in all)",
        ]
        seen: set[str] = set()
        extra = [
            f"{name} {self.times_read(name)} times"
            for name, p in self.read_passes.items()
            if self.times_read(name) > len(p)
        ]
        if extra:
            # A span holds no data: each step taking one reads its chunks itself (a cumulative step's totals, a
            # step beside a reduction); otherwise it is work with halos beside work without.
            why = (
                "by each step taking its spans"
                if self.spans is not None
                else "separately by work with and without halos"
            )
            lines.append(f"  read {why} in one pass: {', '.join(extra)}")
        regathered = [f"{name} {times:.1f} times over" for name, times in self.read_again.items() if times >= 0.05]
        if regathered:
            lines.append(
                "  read again by indices with positions in no order (each chunk once per piece of the result it "
                f"feeds): {', '.join(regathered)}"
            )
        for number, level in enumerate(sorted({p for passes in self.read_passes.values() for p in passes}), 1):
            read = [name for name, passes in self.read_passes.items() if level in passes]
            again = " again" if all(name in seen for name in read) else ""
            seen.update(read)
            work = "; ".join(self.pass_work.get(level, ())) or "the blocks as read"
            lines.append(f"  pass {number}: reads {', '.join(read)}{again}, then {work}")
        if self.worst is not None:
            lines.append(
                f"Largest task: {format_size(self.worst.peak_bytes)} at its peak ({self.worst.operation}, "
                f"pass {self.worst.level + 1}): {self.worst.describe()}"
            )
        held = "".join(f" + {format_size(n)} {what}" for what, n in self.held if n)
        verdict = "within" if self.projected_peak_bytes <= self.budget else "OVER"
        worst = format_size(self.worst.peak_bytes) if self.worst is not None else "0 B"
        lines.append(
            f"Projected peak: {self.concurrency} x {worst}{held} = {format_size(self.projected_peak_bytes)}, "
            f"{verdict} the budget of {format_size(self.budget)}"
        )
        lines.extend(f"Route: {route}" for route in self.routes)
        if self.streaming is not None:
            lines.append(self.streaming.line())
        if self.spans is not None:
            lines.append(self.spans.line())
        lines.extend(
            f"Read in pieces: {source}, each block {format_size(size)} of storage chunks at a time, each piece "
            "reduced while in the cache"
            for source, size in sorted(self.pieces.items())
        )
        lines.extend(f"Limit here: {limit}" for limit in self.limits)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()


__all__ = ["TERMS", "ComputePlan", "Spans", "Streaming", "TaskMemory"]


def refuse_beyond_ceiling(tasks: int, max_tasks: int | None, budget: int, verb: str = "has") -> None:
    """Raise :class:`MemoryBudgetError` when ``tasks`` pass the graph ceiling ``max_tasks`` (``None``: none).

    ``verb`` says how the count is known: ``"has"`` (counted in the graph) or
    ``"needs at least"`` (from the blocks read, before any graph is built).

    >>> refuse_beyond_ceiling(10, 100, 2**20)
    >>> refuse_beyond_ceiling(1000, 100, 2**20, "needs at least")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    daskstream.errors.MemoryBudgetError: this computation needs at least 1,000 tasks, more than the 100 ...
    """
    if max_tasks is None or tasks <= max_tasks:
        return
    # Each task's chunk grows with the budget where the budget bounds it: this many times the
    # budget cuts as many times fewer tasks (a plan names the least: ds.plan(...).explain()).
    times = -(-tasks // max_tasks)
    raise MemoryBudgetError(
        said(
            f"this computation {verb} {tasks:,} tasks, more than the {max_tasks:,} whose graph the "
            "client and scheduler may hold at once (daskstream.planning.max-tasks): compute a part of the "
            "array at a time, or open it with a ",
            named("memory_budget"),
            f" of at least {format_size(times * budget)} (the array's chunk plan names the least that fits)",
        )
    )
