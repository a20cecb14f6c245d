"""Timing a codec so that what is remembered deserves it: rounds until two agree, and the CPU the timing got.

One timing of one codec on a busy machine measures the other work, not the
codec: on a loaded machine zstd level 1 was once timed encoding at 0.09 GB/s
per thread beside level 3 at 0.97 GB/s, and copying bytes ("no compression")
decoding at 0.16 GB/s, and that choice was remembered and reused. So each
operation is timed in rounds (each long enough for the clock and the
scheduler's time slices), until the two closest rounds agree; their
difference is the measurement's spread. The thread's CPU time over the wall
time of the rounds is the share of a CPU it got: well under one means other
work ran on its core. A set of measurements is trusted when every spread is
small, every share large, and the rates are physically consistent (a lower
level of a codec is not much slower to encode than a higher one; no codec
decodes much faster than copying the bytes).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

#: Each timing round lasts at least this long: shorter ones are mostly the clock's and the
#: scheduler's granularity (a time slice is a few milliseconds).
MIN_ROUND_SECONDS = 0.02

#: Two rounds agree when their rates differ by at most this share of the slower one.
AGREE = 0.15

#: Rounds at most: a measurement still without two agreeing rounds keeps its spread, and is not trusted
#: when that spread is large.
MOST_ROUNDS = 4

# A lower level of the same codec encoding slower than this share of a higher level's rate, or a codec
# decoding (encoding) faster than this multiple of copying the bytes, is not a property of the codec.
_LEVEL_SLOWER = 0.5
_FASTER_THAN_COPY = 3.0


@dataclass(frozen=True)
class Timing:
    """One operation timed in rounds.

    Attributes
    ----------
    rate
        Bytes per second: the faster of the two closest rounds.
    spread
        Their relative difference (0.1: one took 10% longer than the other).
    cpu_share
        CPU time of the timing thread over the wall time of all rounds (1.0:
        it ran all the time; 0.2: other work had its core four fifths of it).
    """

    rate: float
    spread: float
    cpu_share: float


def timed(operation: Callable[[], Any], nbytes: int) -> Timing:
    """Time ``operation`` (which handles ``nbytes``) in rounds until two agree within :data:`AGREE`.

    The first call, untimed, sets up tables and buffers and says how many calls make a round of at
    least :data:`MIN_ROUND_SECONDS`.

    Examples
    --------
    >>> timing = timed(lambda: sum(range(1000)), 1000)
    >>> timing.rate > 0 and timing.spread >= 0 and 0 < timing.cpu_share <= 1.05
    True
    """
    start = time.perf_counter()
    operation()
    first = max(time.perf_counter() - start, 1e-7)
    calls = max(1, round(MIN_ROUND_SECONDS / first + 0.5))
    rates: list[float] = []
    wall = cpu = 0.0
    while len(rates) < MOST_ROUNDS:
        wall_start, cpu_start = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            operation()
        seconds = time.perf_counter() - wall_start
        cpu += time.thread_time() - cpu_start
        wall += seconds
        rates.append(calls * nbytes / max(seconds, 1e-9))
        if len(rates) >= 2 and _closest(rates)[1] <= AGREE:
            break
    rate, spread = _closest(rates)
    return Timing(rate, spread, min(1.0, cpu / max(wall, 1e-9)))


def _closest(rates: Sequence[float]) -> tuple[float, float]:
    """The faster rate of the two closest rounds and their relative difference (``inf`` with one round)."""
    ordered = sorted(rates)
    if len(ordered) < 2:
        return ordered[0], float("inf")
    pairs = [(high / low - 1 if low > 0 else float("inf"), high) for low, high in itertools.pairwise(ordered)]
    spread, rate = min(pairs)
    return rate, spread


class Timed(Protocol):
    """What the trust checks read of one candidate's measurement."""

    @property
    def label(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def level(self) -> int: ...
    @property
    def variant(self) -> str: ...
    @property
    def encode_rate(self) -> float: ...
    @property
    def decode_rate(self) -> float: ...
    @property
    def spread(self) -> float: ...
    @property
    def cpu_share(self) -> float: ...


def distrust(measured: Sequence[Timed], *, most_spread: float, least_cpu_share: float) -> str | None:
    """Why these measurements do not deserve remembering, or ``None`` when they do.

    Examples
    --------
    >>> from types import SimpleNamespace as M
    >>> calm = dict(family="zstd", variant="", spread=0.05, cpu_share=0.98, decode_rate=1e9)
    >>> zstd1 = M(label="zstd 1", level=1, encode_rate=0.09e9, **calm)
    >>> zstd3 = M(label="zstd 3", level=3, encode_rate=0.97e9, **calm)
    >>> distrust([zstd1, zstd3], most_spread=0.5, least_cpu_share=0.4)
    'inconsistent: zstd 1 encoded at 0.09 GB/s per thread, zstd 3 at 0.97 GB/s (a lower level is not that much slower)'
    """
    if not measured:
        return None
    busiest = min(measured, key=lambda m: m.cpu_share)
    if busiest.cpu_share < least_cpu_share:
        return (
            f"the machine was busy: timing {busiest.label} got {busiest.cpu_share:.0%} of a CPU "
            f"(at least {least_cpu_share:.0%} is trusted)"
        )
    noisiest = max(measured, key=lambda m: m.spread)
    if noisiest.spread > most_spread:
        spread = "no two rounds" if noisiest.spread == float("inf") else f"rounds {noisiest.spread:.0%} apart"
        return f"noisy: {noisiest.label} timed with {spread} (at most {most_spread:.0%} is trusted)"
    return _inconsistent(measured)


def _inconsistent(measured: Sequence[Timed]) -> str | None:
    """A physically implausible pair of rates, said, or ``None``."""
    for low in measured:
        for high in measured:
            same_codec = low.family == high.family and low.variant == high.variant
            if same_codec and low.level < high.level and low.encode_rate < _LEVEL_SLOWER * high.encode_rate:
                return (
                    f"inconsistent: {low.label} encoded at {low.encode_rate / 1e9:.2f} GB/s per thread, "
                    f"{high.label} at {high.encode_rate / 1e9:.2f} GB/s (a lower level is not that much slower)"
                )
    copy = next((m for m in measured if m.family == "none"), None)
    if copy is not None:
        for m in measured:
            for what in ("decode", "encode"):
                rate, copied = getattr(m, f"{what}_rate"), getattr(copy, f"{what}_rate")
                if m is not copy and rate > _FASTER_THAN_COPY * copied:
                    return (
                        f"inconsistent: {m.label} {what}d at {rate / 1e9:.2f} GB/s per thread, copying the "
                        f"bytes at {copied / 1e9:.2f} GB/s (no codec {what}s much faster than a copy)"
                    )
    return None


__all__ = ["AGREE", "MIN_ROUND_SECONDS", "MOST_ROUNDS", "Timing", "distrust", "timed"]
