"""Rich views for Jupyter: HTML tables and a picture of the storage grid inside the task grid.

>>> svg = grid_svg((1000, 800), storage_chunks=(100, 400), task_chunks=(500, 800))
>>> svg.startswith("<svg"), svg.count("stroke:#9aa5b1"), svg.count("stroke:#1f6fb2;stroke-width:1.5")
(True, 10, 1)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

import dask.array.svg
import numpy as np
from dask.array.core import normalize_chunks


def table(rows: Iterable[tuple[str, Any]], *, code: bool = False) -> str:
    """An HTML table of ``(label, value)`` rows, values escaped."""
    wrap = (lambda v: f"<code>{v}</code>") if code else (lambda v: v)
    body = "".join(
        f"<tr><th style='text-align:left'>{escape(str(k))}</th><td>{wrap(escape(str(v)))}</td></tr>" for k, v in rows
    )
    return f"<table>{body}</table>"


def columns_table(header: Sequence[str], rows: Iterable[Sequence[str]], *, marked: Iterable[bool] = ()) -> str:
    """An HTML table under ``header``, cells escaped; a row whose ``marked`` entry is true is highlighted.

    >>> columns_table(["a", "b"], [["1", "<2>"]], marked=[True]).count("<td>")
    2
    """
    marks = iter(marked)
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        style = " style='font-weight:bold;background:#e8f4e8'" if next(marks, False) else ""
        body.append(f"<tr{style}>" + "".join(f"<td>{escape(v)}</td>" for v in row) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def card(title: str, *parts: str, picture: str = "", caption: str = "") -> str:
    """A titled block of HTML ``parts``, with ``picture`` beside them and ``caption`` under the title.

    >>> "display:flex" in card("t", "<table></table>", picture="<svg></svg>")
    True
    """
    head = f"<div style='font-weight:bold;margin:0 0 2px 0'>{escape(title)}</div>"
    under = f"<div style='color:#555;margin:0 0 6px 0'>{escape(caption)}</div>" if caption else ""
    body = "".join(parts)
    if picture:
        body = (
            "<div style='display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start'>"
            f"<div>{picture}</div><div>{body}</div></div>"
        )
    return f"<div style='margin:4px 0'>{head}{under}{body}</div>"


def details(summary: str, text: str) -> str:
    """A folded block of preformatted ``text`` under ``summary`` (an explanation, a log)."""
    return f"<details><summary>{escape(summary)}</summary><pre>{escape(text)}</pre></details>"


# The pictures' size in pixels, and the most lines dask draws along an axis of it.
_SIZE = 180
_MOST_LINES = _SIZE // 6
_TASK_COLOUR = "#1f6fb2"
_STORAGE_COLOUR = "#9aa5b1"
_FACE = "#e3edf7"
_FACE_DENSE = "#b9cde3"


def _drawn_chunks(shape: tuple[int, ...], chunks: Sequence[Any] | None, most: int) -> tuple[tuple[int, ...], ...]:
    """``chunks`` as dask's per-axis tuples; an axis cut into more than ``most`` pieces drawn as ``most + 1``.

    The picture cannot show more lines than it has pixels for (dask draws at
    most ``most`` of them anyway), and the legend gives the true counts.
    """
    per_axis: list[int | tuple[int, ...]] = []
    for axis, n in enumerate(shape):
        given: Any = chunks[axis] if chunks is not None and axis < len(chunks) else n
        if isinstance(given, (int, np.integer)):
            step = min(max(int(given), 1), n)
            per_axis.append(step if -(-n // step) <= most else -(-n // (most + 1)))
        else:
            pieces = tuple(int(c) for c in given)
            per_axis.append(pieces if len(pieces) <= most else -(-n // (most + 1)))
    return normalize_chunks(tuple(per_axis), shape)


def _too_fine(shape: Sequence[int], storage_chunks: Sequence[int], most: int) -> bool:
    """Whether storage chunks are more along some axis than a picture draws lines (so they are tinted)."""
    return any(-(-int(n) // max(int(c), 1)) > most for n, c in zip(shape, storage_chunks))


def _pieces(picture: str) -> tuple[str, list[str], str]:
    """An SVG of dask's split into its opening tag, its elements and its closing tag."""
    lines = [line.strip() for line in picture.splitlines()]
    elements = [line for line in lines[1:-1] if line and not line.startswith("<!--")]
    return lines[0], elements, lines[-1]


def grid_svg(
    shape: Sequence[int],
    *,
    storage_chunks: Sequence[int] | None,
    task_chunks: Sequence[Any] | None,
    size: int = _SIZE,
) -> str:
    """dask's picture of an array's chunks, storage chunks as thin grey lines inside task chunks as blue ones.

    Every axis is drawn as dask draws it: a bar for 1-D, a rectangle for 2-D,
    a cube for 3-D and a row of cubes beyond, with each axis's length beside
    it. ``task_chunks`` of ``None`` draws the storage grid alone. A storage
    grid finer than the picture can show is drawn as a darker tint instead of
    lines. An empty or 0-d array has no picture (``""``).
    """
    shape = tuple(int(n) for n in shape)
    if not shape or 0 in shape:
        return ""
    most = size // 6  # dask draws at most this many lines along an axis
    header, elements, footer = _pieces(dask.array.svg.svg(_drawn_chunks(shape, task_chunks, most), size=size))
    header = header.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" role="img" ', 1)
    header = header.replace("stroke:rgb(0,0,0)", f"stroke:{_TASK_COLOUR}", 1)
    storage_lines: list[str] = []
    dense = False
    if storage_chunks is not None:
        dense = _too_fine(shape, storage_chunks, most)
        if not dense:
            _, drawn, _ = _pieces(dask.array.svg.svg(_drawn_chunks(shape, storage_chunks, most), size=size))
            # A storage grid's outer lines are the array's edges, drawn once, by the task grid.
            storage_lines = [
                line.replace("<line ", f'<line style="stroke:{_STORAGE_COLOUR};stroke-width:0.7" ', 1)
                for line in drawn
                if line.startswith("<line") and "stroke-width:2" not in line
            ]
    face = _FACE_DENSE if dense else _FACE
    faces = [re.sub(r"fill:#(ECB172|8B4903)A0", f"fill:{face}", e) for e in elements if e.startswith("<polygon")]
    task_lines = [
        line.replace('style="stroke-width:2"', f'style="stroke:{_TASK_COLOUR};stroke-width:2.5"')
        if "stroke-width:2" in line
        else line.replace("<line ", f'<line style="stroke:{_TASK_COLOUR};stroke-width:1.5" ', 1)
        for line in elements
        if line.startswith("<line")
    ]
    labels = [
        e.replace("<text ", '<text stroke="none" fill="#333" ', 1)
        for e in elements
        if not e.startswith(("<line", "<polygon"))
    ]
    if len(shape) % 3 == 1:
        del labels[1]  # dask draws these as if with a leading axis of length 1; its label is not the array's
    return "\n".join([header, *faces, *storage_lines, *task_lines, *labels, footer])


def split_legend(
    shape: Sequence[int], storage_chunks: Sequence[int] | None, task_chunks: Sequence[Any] | None
) -> list[str]:
    """How each axis is split, in words: its length, the tasks along it and the storage chunks in each.

    >>> split_legend((2048, 512), (64, 512), (128, 512))
    ['axis 0: 2048 in 16 tasks of 128 (2 storage chunks each)', 'axis 1: 512, whole']
    >>> split_legend((10,), None, None)
    ['axis 0: 10']
    """
    lines = []
    for axis, n in enumerate(int(n) for n in shape):
        store = int(storage_chunks[axis]) if storage_chunks is not None else None
        task = task_chunks[axis] if task_chunks is not None else None
        task = int(task) if isinstance(task, (int, np.integer)) else (int(max(task)) if task else None)
        stored = f"{-(-n // store)} storage chunks of {store}" if store is not None and store < n else ""
        if task is not None and task < n:
            inside = f" ({-(-task // store)} storage chunks each)" if store is not None and store < task else ""
            lines.append(f"axis {axis}: {n} in {-(-n // task)} tasks of {task}{inside}")
        elif task_chunks is not None:
            lines.append(f"axis {axis}: {n}, whole" + (f" in each task, {stored}" if stored else ""))
        else:
            lines.append(f"axis {axis}: {n}" + (f" in {stored}" if stored else ""))
    return lines


def grid_figure(shape: Sequence[int], storage_chunks: Sequence[int] | None, task_chunks: Sequence[Any] | None) -> str:
    """:func:`grid_svg` with its legend (what the lines are, and each axis's split), as an HTML block."""
    svg = grid_svg(shape, storage_chunks=storage_chunks, task_chunks=task_chunks)
    if not svg:
        return ""
    if storage_chunks is None:
        what = "stored contiguously" + ("; task chunks (blue)" if task_chunks is not None else "")
    else:
        what = "storage chunks (grey)" + (" inside task chunks (blue)" if task_chunks is not None else "")
        if _too_fine(shape, storage_chunks, _MOST_LINES):
            what += "; storage chunks too many to draw, tinted"
    legend = "<br>".join(escape(line) for line in [what, *split_legend(shape, storage_chunks, task_chunks)])
    return f"{svg}<div style='max-width:300px'><small>{legend}</small></div>"
