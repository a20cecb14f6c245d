"""What a tuning found: the winner, every candidate it looked at, and how it compares with the planner."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from html import escape
from typing import Any

from daskstream.dependencies import optional_import
from daskstream.display import card, columns_table, grid_figure
from daskstream.planning.budget import format_size


@dataclass(frozen=True)
class Candidate:
    """One chunk shape the tuner looked at.

    Attributes
    ----------
    chunks
        The chunk shape (edge chunks may be smaller).
    chunk_bytes, tasks
        Bytes in one chunk; chunks over the whole array.
    throughput
        Projected bytes per second over the whole array (``None`` when pruned).
    spread
        Relative noise of that figure (half the range of the timed batches).
    peak_task_bytes
        Peak memory of one task: measured for the first candidate, projected
        from it (same multiple of the chunk) for the others.
    peak_measured
        Whether ``peak_task_bytes`` was measured rather than projected.
    pruned
        Why it was not timed (memory, parallelism, overhead floor), else ``None``.
    origin
        ``"planner"`` (the rule-based choice), ``"climb"``, or ``"observed"``
        (a shape seen in an earlier computation).
    """

    chunks: tuple[int, ...]
    chunk_bytes: int
    tasks: int
    throughput: float | None
    spread: float | None
    peak_task_bytes: int | None
    peak_measured: bool
    pruned: str | None
    origin: str

    def row(self) -> dict[str, Any]:
        """The candidate as one table row of plain values."""
        return {**asdict(self), "chunks": list(self.chunks)}

    def cells(self) -> tuple[str, ...]:
        """Chunks, size, tasks, GB/s, noise, peak per task and note, as a table shows them."""
        return (
            str(self.chunks),
            format_size(self.chunk_bytes),
            str(self.tasks),
            "-" if self.throughput is None else f"{self.throughput / 1e9:.2f}",
            "-" if self.spread is None else f"{100 * self.spread:.0f}%",
            "-" if self.peak_task_bytes is None else format_size(self.peak_task_bytes),
            self.pruned or self.origin,
        )


@dataclass(frozen=True)
class TuneResult:
    """The outcome of :func:`daskstream.tune`.

    Attributes
    ----------
    chunks
        The winning chunk shape; ``daskstream.open(path, chunks=result.chunks)`` uses it.
    auto_chunks
        The planner's rule-based choice (``chunks="auto"``).
    candidates
        Every candidate looked at, in order (see :class:`Candidate`).
    speedup_vs_auto
        Winner's measured throughput over the planner's choice's, or ``None``
        when nothing could be measured.
    work
        What was tuned for, as the tuning cache names it (a reduction's chunk
        step such as ``mean_chunk``, ``"describe"``, or a kernel's name).
    operation
        The same for people: the operation asked for (``"mean"``) or the
        kernel's name; what tables, pictures and titles show.
    source
        The source tuned on (``path`` or ``path::dataset``).
    seconds
        Time the tuning took (a cache hit: the lookup).
    sampled_bytes
        Bytes read while measuring.
    stopped
        Why the search ended.
    from_cache
        True when the result was remembered, not measured now.
    key
        The cache key (kind of data, work, scheduler, machine).
    shape, storage_chunks
        The source's shape and storage grid (for the picture in Jupyter).
    """

    chunks: tuple[int, ...]
    auto_chunks: tuple[int, ...]
    candidates: tuple[Candidate, ...]
    speedup_vs_auto: float | None
    work: str
    source: str
    seconds: float
    sampled_bytes: int
    stopped: str
    from_cache: bool = False
    operation: str = ""
    key: dict[str, Any] = field(default_factory=dict, compare=False)
    shape: tuple[int, ...] = ()
    storage_chunks: tuple[int, ...] | None = None

    @property
    def title(self) -> str:
        """What was tuned for, as a person names it."""
        return self.operation or self.work

    @property
    def measured(self) -> bool:
        """Whether any candidate was timed (now, or when the remembered result was)."""
        return self.from_cache or any(c.throughput is not None for c in self.candidates)

    @property
    def fastest(self) -> Candidate | None:
        """The candidate with the highest measured throughput (which the noise rule may not have taken)."""
        timed = [c for c in self.candidates if c.throughput is not None]
        return max(timed, key=lambda c: c.throughput or 0.0) if timed else None

    def fastest_not_taken(self) -> str | None:
        """Why the fastest measured candidate is not the winner, when it is not; else ``None``."""
        fastest, winner = self.fastest, self.winner
        if fastest is None or winner is None or fastest is winner or fastest.throughput is None:
            return None
        if winner.throughput is None:
            return None
        gain = fastest.throughput / winner.throughput - 1
        noise = (fastest.spread or 0) + (winner.spread or 0)
        return (
            f"{fastest.chunks} measured {gain:.0%} faster than {winner.chunks}, within the noise of the two "
            f"measurements ({noise:.0%}): a step is taken only when it beats the noise, so {winner.chunks} is kept"
        )

    @property
    def winner(self) -> Candidate | None:
        """The candidate row of the winning chunks."""
        return next((c for c in self.candidates if self.won(c)), None)

    def won(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` is the winner's row."""
        return candidate.chunks == self.chunks and candidate.pruned is None

    def to_dict(self) -> dict[str, Any]:
        """Plain values, as ``daskstream tune --json`` prints them."""
        return {
            "source": self.source,
            "work": self.work,
            "operation": self.title,
            "chunks": list(self.chunks),
            "auto_chunks": list(self.auto_chunks),
            "speedup_vs_auto": self.speedup_vs_auto,
            "seconds": self.seconds,
            "sampled_bytes": self.sampled_bytes,
            "stopped": self.stopped,
            "from_cache": self.from_cache,
            "key": self.key,
            "candidates": [c.row() for c in self.candidates],
        }

    def to_dataframe(self) -> Any:
        """The candidates as a ``pandas.DataFrame`` (needs pandas), in the units the tables show.

        Columns: ``chunks``, ``MiB`` (one chunk), ``tasks``, ``GB/s``
        (projected over the whole array), ``± %`` (the noise), ``peak MiB``
        (one task), ``peak measured``, ``pruned``, ``origin``, ``winner``.
        """
        pd = optional_import("pandas", package="pandas", needed_for="TuneResult.to_dataframe", extra="notebook")
        rows = [
            {
                "chunks": c.chunks,
                "MiB": c.chunk_bytes / 2**20,
                "tasks": c.tasks,
                "GB/s": None if c.throughput is None else c.throughput / 1e9,
                "± %": None if c.spread is None else 100 * c.spread,
                "peak MiB": None if c.peak_task_bytes is None else c.peak_task_bytes / 2**20,
                "peak measured": c.peak_measured,
                "pruned": c.pruned,
                "origin": c.origin,
                "winner": self.won(c),
            }
            for c in self.candidates
        ]
        return pd.DataFrame(rows, columns=list(_FRAME_COLUMNS))

    def plot(self, ax: Any = None) -> Any:
        """Throughput against chunk size, the spread as error bars, each point labelled with its chunks and
        the winner marked (needs matplotlib).

        Returns the matplotlib ``Figure``: shown once in Jupyter (the figure made
        here is closed, so the notebook does not draw it a second time). With
        ``ax``, draws into it and returns its figure.
        """
        plt = optional_import("matplotlib.pyplot", package="matplotlib", needed_for="TuneResult.plot", extra="notebook")
        made = ax is None
        if ax is None:
            figure, ax = plt.subplots(figsize=(6, 3.5))
        timed = [(c, c.throughput) for c in self.candidates if c.throughput is not None]
        sizes = [c.chunk_bytes / 2**20 for c, _ in timed]
        rates = [throughput / 1e9 for _, throughput in timed]
        errors = [throughput * (c.spread or 0) / 1e9 for c, throughput in timed]
        ax.errorbar(sizes, rates, yerr=errors, fmt="o", color="tab:blue", label="measured")

        def mark(candidate: Candidate, throughput: float, **style: Any) -> None:
            ax.scatter([candidate.chunk_bytes / 2**20], [throughput / 1e9], **style)

        for c, throughput in timed:
            if c.origin == "planner":
                mark(c, throughput, marker="s", s=90, facecolors="none", edgecolors="tab:gray", label="planner (auto)")
        winner = self.winner
        if winner is not None and winner.throughput is not None:
            mark(winner, winner.throughput, marker="*", s=220, color="tab:red", label="winner", zorder=3)
        # Candidates of one size (other shapes) sit on one spot: each point says which it is, one under another.
        at_size: dict[float, int] = {}
        for c, throughput in timed:
            size = c.chunk_bytes / 2**20
            stacked = at_size.get(size, 0)
            at_size[size] = stacked + 1
            ax.annotate(
                "x".join(map(str, c.chunks)),
                (size, throughput / 1e9),
                xytext=(6, 4 - 10 * stacked),
                textcoords="offset points",
                fontsize=7,
                color="dimgray",
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("chunk size (MiB)")
        ax.set_ylabel("projected throughput (GB/s)")
        ax.set_title(f"{self.title} on {self.source}", fontsize=9)
        ax.legend(fontsize=8)
        ax.margins(x=0.15)  # room for the last point's label
        if made:
            figure.tight_layout()  # the axis labels inside the picture
            plt.close(figure)
        return ax.figure

    def table(self) -> str:
        """The candidates as a plain-text table."""
        lines = [f"{'chunks':<24} {'size':>10} {'tasks':>7} {'GB/s':>7} {'±':>5} {'peak/task':>11}  note"]
        for c, note in zip(self.candidates, self.notes()):
            chunks, size, tasks, rate, noise, peak, _ = c.cells()
            # "~": projected from the measured candidate, not measured itself.
            peak += "" if c.peak_task_bytes is None or c.peak_measured else "~"
            lines.append(
                f"{'*' if self.won(c) else ' '}{chunks:<23} {size:>10} {tasks:>7} {rate:>7} {noise:>5} "
                f"{peak:>11}  {note}"
            )
        return "\n".join(lines)

    def notes(self) -> list[str]:
        """Each candidate's note: why it was pruned, where it came from, and for the fastest measured one that
        the noise rule did not take, that it was faster."""
        fastest = self.fastest if self.fastest_not_taken() else None
        return [
            f"{c.pruned or c.origin}; fastest, within the noise" if c is fastest else (c.pruned or c.origin)
            for c in self.candidates
        ]

    def __repr__(self) -> str:
        # What a terminal shows at the prompt: the outcome in one line (print(result) for the candidates).
        if not self.measured:
            return f"<daskstream TuneResult {self.title} on {self.source}: not tuned, the planner's {self.chunks}>"
        speed = "" if self.speedup_vs_auto is None else f", {self.speedup_vs_auto:.2f}x the planner's"
        origin = "remembered" if self.from_cache else f"{len(self.candidates)} candidate(s)"
        return (
            f"<daskstream TuneResult {self.title} on {self.source}: chunks={self.chunks}{speed} "
            f"(planner: {self.auto_chunks}; {origin})>"
        )

    def __str__(self) -> str:
        if not self.measured:
            return f"Not tuned: {self.title} on {self.source}: chunks {self.chunks}, the planner's.\n{self.stopped}"
        speed = "not measured" if self.speedup_vs_auto is None else f"{self.speedup_vs_auto:.2f}x the planner's"
        origin = "remembered" if self.from_cache else f"{len(self.candidates)} candidate(s), {self.seconds:.2f} s"
        kept = self.fastest_not_taken()
        return (
            f"Tuned {self.title} on {self.source} ({origin}, read {format_size(self.sampled_bytes)}): "
            f"chunks {self.chunks}, {speed} (auto: {self.auto_chunks})\n{self.table()}\nStopped: {self.stopped}"
            + (f"\nNote: {kept}" if kept else "")
        )

    def _repr_html_(self) -> str:
        candidates = columns_table(
            ("chunks", "size", "tasks", "GB/s", "±", "peak per task", "note"),
            [(*c.cells()[:-1], note) for c, note in zip(self.candidates, self.notes())],
            marked=[self.won(c) for c in self.candidates],
        )
        kept = self.fastest_not_taken()
        title = f"{self.title} on {self.source}"
        if not self.measured:
            return card(
                "daskstream TuneResult",
                f"<strong>not tuned</strong>: the planner's chunks <code>{escape(str(self.chunks))}</code>"
                f"<br>{escape(self.stopped)}",
                caption=title,
            )
        speed = "-" if self.speedup_vs_auto is None else f"{self.speedup_vs_auto:.2f}x"
        summary = (
            f"winner <code>{escape(str(self.chunks))}</code>, {speed} the planner's "
            f"<code>{escape(str(self.auto_chunks))}</code>{' (remembered)' if self.from_cache else ''}"
            + (f"<br>{escape(kept)}" if kept else "")
        )
        footer = f"<small>{escape(self.stopped)}; {self.seconds:.2f} s, read {escape(format_size(self.sampled_bytes))}</small>"
        picture = grid_figure(self.shape, self.storage_chunks, self.chunks) if self.shape else ""
        return card("daskstream TuneResult", summary, candidates, footer, picture=picture, caption=title)


_FRAME_COLUMNS = ("chunks", "MiB", "tasks", "GB/s", "± %", "peak MiB", "peak measured", "pruned", "origin", "winner")
