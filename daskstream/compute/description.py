"""The results of ``describe``: the statistics of an array, as a person reads them and as a program takes them.

A :class:`Description` is a read-only mapping of statistic to value; it says
what it describes (name, shape, dtype, axes), prints as a table (a line per
statistic; over some axes, each statistic's shape and range), shows as a card
in Jupyter with its histogram drawn, and turns into a pandas DataFrame or a
matplotlib histogram. A :class:`LazyDescription` is what ``describe`` returns
before anything is read: a dask collection whose result is the Description.
"""

from __future__ import annotations

import builtins
import warnings
from collections.abc import Callable, Iterator, Mapping
from html import escape
from typing import Any

import dask
import numpy as np
from dask.delayed import Delayed

from daskstream.advice import keyword, said
from daskstream.dependencies import optional_import
from daskstream.display import card, table
from daskstream.errors import InvalidArgumentError


class Description(Mapping):
    """The statistics of an array: a read-only mapping, with a table in a terminal and in Jupyter.

    Keys are :data:`STATISTICS`, the quartiles ``"25%"``, ``"50%"`` and
    ``"75%"`` when they were asked for, and ``"histogram"`` (counts) and
    ``"bin_edges"`` when bins were. Values are numpy scalars, or arrays over
    the kept axes when ``describe`` reduced only some axes.

    Attributes
    ----------
    name
        What was described (a source's name, ``path::dataset``), or ``None``
        for an array daskstream did not open itself.
    shape, dtype
        The described array's.
    axes
        The axes reduced (all of them unless ``axis`` was given).
    """

    def __init__(
        self,
        values: dict[str, Any],
        *,
        name: str | None = None,
        shape: tuple[int, ...] | None = None,
        dtype: Any = None,
        axes: tuple[int, ...] | None = None,
    ) -> None:
        self._values = values
        self.name = name
        self.shape = shape
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.axes = axes

    def replaced(self, values: dict[str, Any]) -> Description:
        """The same description (name, shape, axes) of other ``values``: labelled ones, say."""
        return Description(values, name=self.name, shape=self.shape, dtype=self.dtype, axes=self.axes)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def statistics(self) -> list[str]:
        """The keys that are statistics (not the histogram or its edges), in the order shown."""
        return [k for k in self._values if k not in ("histogram", "bin_edges")]

    @property
    def kept_shape(self) -> tuple[int, ...]:
        """The shape of each statistic: ``()`` over all axes, else the kept axes' lengths."""
        return tuple(np.shape(np.asarray(self._values["count"])))

    def title(self) -> str:
        """What was described, in words: its name, shape and dtype, and over which axes."""
        what = self.name or "an array"
        shape = "" if self.shape is None else f" {self.shape}"
        dtype = "" if self.dtype is None else f" {self.dtype}"
        if self.axes is None or self.shape is None or len(self.axes) == len(self.shape):
            over = "over all axes"
        else:
            over = f"over axis {', '.join(map(str, self.axes))}, per position of the other axes {self.kept_shape}"
        return f"{what}{shape}{dtype}, {over}"

    def rows(self) -> list[tuple[str, str]]:
        """``(statistic, value)`` for a scalar description; per-axis ones summarise each statistic's array."""
        if not self.kept_shape:
            return [(k, format_number(self._values[k])) for k in self.statistics]
        return [(k, summarised(self._values[k])) for k in self.statistics]

    def histogram_rows(self) -> list[tuple[str, str, str]]:
        """``(low, high, count)`` per bin of a histogram over all axes; ``[]`` without one (or per axis)."""
        if "histogram" not in self._values or self.kept_shape:
            return []
        edges, counts = np.asarray(self._values["bin_edges"]), np.asarray(self._values["histogram"])
        return [
            (format_number(edges[i]), format_number(edges[i + 1]), format_number(counts[i]))
            for i in builtins.range(len(counts))
        ]

    def __repr__(self) -> str:
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        lines = [f"describe of {self.title()}"]
        lines += [f"  {k:<{width}}  {v}" for k, v in rows]
        bins = self.histogram_rows()
        if bins:
            lines.append("  histogram (bins: low <= value < high; the last bin includes its high edge)")
            widths = [max(len(r[c]) for r in bins) for c in builtins.range(3)]
            lines += [f"    {lo:>{widths[0]}} .. {hi:<{widths[1]}}  {n:>{widths[2]}}" for lo, hi, n in bins]
        elif "histogram" in self._values:
            lines.append(f"  histogram   {summarised(self._values['histogram'])} (counts per position and bin)")
        return "\n".join(lines)

    def to_dataframe(self) -> Any:
        """The statistics as a pandas DataFrame (needs pandas: ``pip install 'daskstream[notebook]'``).

        Over all axes: one row per statistic, in a column named after the
        array. Over some axes: one row per position of the kept axes (a
        MultiIndex of them), one column per statistic. The histogram is not in
        it: see :meth:`plot` and the ``histogram``/``bin_edges`` keys.
        """
        pd = optional_import("pandas", package="pandas", needed_for="Description.to_dataframe", extra="notebook")
        if not self.kept_shape:
            values = [_python(self._values[k]) for k in self.statistics]
            # An object column keeps each statistic's own type: counts stay whole numbers beside the floats.
            column = pd.Series(values, index=pd.Index(self.statistics, name="statistic"), dtype=object)
            return column.to_frame(self.name or "value")
        kept = [a for a in builtins.range(len(self.shape or ())) if a not in (self.axes or ())]
        index = pd.MultiIndex.from_product(
            [builtins.range(n) for n in self.kept_shape], names=[f"axis {a}" for a in kept] or None
        )
        columns = {k: np.asarray(self._values[k]).reshape(-1) for k in self.statistics}
        return pd.DataFrame(columns, index=index)

    def plot(self, ax: Any = None) -> Any:
        """The histogram as bars (needs matplotlib: ``pip install 'daskstream[notebook]'``).

        Returns the matplotlib ``Figure`` (closed, so Jupyter draws it once);
        with ``ax``, draws into it and returns its figure.

        Raises
        ------
        InvalidArgumentError
            Without a histogram (describe with ``bins=``), or of a per-axis description.
        """
        if "histogram" not in self._values or self.kept_shape:
            raise InvalidArgumentError(
                said(
                    "plot() draws the histogram of a description over all axes: describe with ",
                    keyword("bins"),
                    " (and no axis) first",
                )
            )
        plt = optional_import(
            "matplotlib.pyplot", package="matplotlib", needed_for="Description.plot", extra="notebook"
        )
        made = ax is None
        if ax is None:
            figure, ax = plt.subplots(figsize=(6, 3))
        edges, counts = np.asarray(self._values["bin_edges"], dtype=float), np.asarray(self._values["histogram"])
        ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="#1f6fb2", edgecolor="white")
        ax.set_xlabel("value")
        ax.set_ylabel("count")
        ax.set_title(f"histogram of {self.name or 'the array'}", fontsize=10)
        figure = ax.figure
        if made:
            plt.close(figure)
        return figure

    def _repr_html_(self) -> str:
        body = table(self.rows(), code=True)
        bins = self.histogram_rows()
        picture = ""
        if bins:
            edges = np.asarray(self._values["bin_edges"], dtype=float)
            picture = histogram_svg(edges, np.asarray(self._values["histogram"]))
        return card("daskstream describe", body, picture=picture, caption=self.title())


def format_number(value: Any) -> str:
    """One number as a person reads it: integers whole, floats to 6 significant digits, complex as a+bj.

    >>> format_number(np.int64(65536)), format_number(np.float32(0.49971235)), format_number(1e-9)
    ('65536', '0.499712', '1e-09')
    >>> format_number(np.complex128(1.5 - 2j)), format_number(np.float64("nan"))
    ('1.5-2j', 'nan')
    """
    value = np.asarray(value)[()]
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (complex, np.complexfloating)):
        return f"{value.real:.6g}{value.imag:+.6g}j"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.6g}"
    return str(value)


def summarised(value: Any) -> str:
    """An array of a statistic in one line: its shape and dtype, and its least, mean and largest values.

    >>> summarised(np.array([1.0, 2.0, 4.0]))
    '(3,) float64: min 1, mean 2.33333, max 4'
    """
    array = np.asarray(value)
    head = f"{array.shape} {array.dtype}"
    if array.size == 0 or array.dtype.kind not in "biufc":
        return head
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN statistics summarise as nan
        if array.dtype.kind == "c":
            return f"{head}: mean {format_number(np.nanmean(array))}"
        low, mean, high = np.nanmin(array), np.nanmean(array), np.nanmax(array)
    return f"{head}: min {format_number(low)}, mean {format_number(mean)}, max {format_number(high)}"


def histogram_svg(edges: np.ndarray, counts: np.ndarray, *, width: int = 240, height: int = 110) -> str:
    """A histogram's bars as a small SVG (no plotting library needed), the edges' ends and the top count labelled."""
    if counts.size == 0:
        return ""
    top = max(int(counts.max()), 1)
    span = float(edges[-1] - edges[0]) or 1.0
    bars = []
    for i, count in enumerate(counts):
        x0 = (float(edges[i]) - float(edges[0])) / span * width
        x1 = (float(edges[i + 1]) - float(edges[0])) / span * width
        h = int(count) / top * (height - 20)
        bars.append(
            f'<rect x="{x0:.1f}" y="{height - 14 - h:.1f}" width="{max(x1 - x0 - 0.5, 0.5):.1f}" '
            f'height="{h:.1f}" fill="#1f6fb2"/>'
        )
    labels = (
        f'<text x="0" y="{height - 2}" font-size="10" fill="#333">{escape(format_number(edges[0]))}</text>'
        f'<text x="{width}" y="{height - 2}" font-size="10" fill="#333" text-anchor="end">'
        f"{escape(format_number(edges[-1]))}</text>"
        f'<text x="0" y="9" font-size="10" fill="#333">{top}</text>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}">'
        f"{''.join(bars)}{labels}</svg><br><small>histogram: {len(counts)} bins</small>"
    )


def _python(value: Any) -> Any:
    return np.asarray(value)[()].item() if np.ndim(value) == 0 else value


class LazyDescription:
    """What :func:`describe` returns: nothing is read until :meth:`compute`.

    A dask collection: ``dask.compute`` and :meth:`daskstream.Session.compute`
    accept it (alongside other collections, sharing their reads) and give back
    the :class:`Description`.

    Attributes
    ----------
    delayed
        The ``dask.delayed`` object that yields the :class:`Description`.
    relabel
        What turns the computed :class:`Description` into the one given back
        (labelling its statistics for a DataArray), or ``None``.
    """

    def __init__(
        self, delayed: Any, n_chunks: int, relabel: Callable[[Description], Description] | None = None
    ) -> None:
        self.delayed = delayed
        self.n_chunks = n_chunks
        self.relabel = relabel

    def compute(self, **kwargs: Any) -> Description:
        """Read the data once and return the :class:`Description` (kwargs go to ``dask.compute``)."""
        (result,) = dask.compute(self, **kwargs)
        return result

    def __repr__(self) -> str:
        return f"<LazyDescription over {self.n_chunks} chunk(s); call .compute()>"

    # The dask collection protocol, delegated to the delayed object.
    def __dask_graph__(self) -> Any:
        return self.delayed.__dask_graph__()

    def __dask_keys__(self) -> Any:
        return self.delayed.__dask_keys__()

    def __dask_layers__(self) -> Any:
        return self.delayed.__dask_layers__()

    def __dask_tokenize__(self) -> Any:
        return self.delayed.key

    def __dask_postcompute__(self) -> Any:
        finalize, args = self.delayed.__dask_postcompute__()
        if self.relabel is None:
            return finalize, args
        return _relabelled, (finalize, args, self.relabel)

    def __dask_postpersist__(self) -> Any:
        rebuild, args = self.delayed.__dask_postpersist__()
        return _rebuild_description, (rebuild, args, self.n_chunks, self.relabel)

    __dask_optimize__ = staticmethod(Delayed.__dask_optimize__)
    __dask_scheduler__ = staticmethod(Delayed.__dask_scheduler__)


def _rebuild_description(
    dsk: Any, rebuild: Any, args: Any, n_chunks: int, relabel: Any, **kwargs: Any
) -> LazyDescription:
    return LazyDescription(rebuild(dsk, *args, **kwargs), n_chunks, relabel)


def _relabelled(results: Any, finalize: Any, args: Any, relabel: Callable[[Description], Description]) -> Description:
    return relabel(finalize(results, *args))


__all__ = ["Description", "LazyDescription", "format_number", "histogram_svg", "summarised"]
