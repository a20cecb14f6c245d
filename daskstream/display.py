"""Rich views for Jupyter: HTML tables and a picture of the storage grid inside the task grid.

>>> svg = grid_svg((1000, 800), storage_chunks=(100, 400), task_chunks=(500, 800))
>>> svg.startswith("<svg") and svg.count("<line") == 9 + 1 + 1  # storage: 9 across, 1 down; tasks: 1 across
True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

# Beyond this many lines along an axis the grid is drawn as a shaded band instead (still to scale).
_MAX_LINES = 48


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


def card(title: str, *parts: str) -> str:
    """A titled block of HTML ``parts``."""
    return f"<div><strong>{escape(title)}</strong>{''.join(parts)}</div>"


def details(summary: str, text: str) -> str:
    """A folded block of preformatted ``text`` under ``summary`` (an explanation, a log)."""
    return f"<details><summary>{escape(summary)}</summary><pre>{escape(text)}</pre></details>"


def _cuts(n: int, step: int | None) -> list[int]:
    if not step or step >= n:
        return []
    return list(range(step, n, step))


def grid_svg(
    shape: Sequence[int],
    *,
    storage_chunks: Sequence[int] | None,
    task_chunks: Sequence[int] | None,
    size: int = 180,
) -> str:
    """An SVG of the last two axes: storage chunks as thin grey lines inside task chunks as thick blue ones.

    A 1-D array is drawn as one row. Lines of a grid finer than the picture
    can show are replaced by a grey tint, so the picture stays small.
    """
    dims = [int(n) for n in shape[-2:]] if len(shape) >= 2 else [1, int(shape[0]) if shape else 1]

    def last_two(chunks: Sequence[int] | None) -> list[int | None]:
        if chunks is None:
            return [None, None]
        picked = list(chunks[-2:]) if len(shape) >= 2 else [1, chunks[0] if chunks else None]
        return [int(c) if c else None for c in picked]

    storage, tasks = last_two(storage_chunks), last_two(task_chunks)
    rows, cols = max(dims[0], 1), max(dims[1], 1)
    scale = size / max(rows, cols)
    height, width = max(rows * scale, 12), max(cols * scale, 12)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 2:.0f}" height="{height + 2:.0f}" '
        f'viewBox="-1 -1 {width + 2:.0f} {height + 2:.0f}" role="img">',
        f'<rect x="0" y="0" width="{width:.1f}" height="{height:.1f}" fill="#f4f7fb" stroke="none"/>',
    ]
    for grid, colour, stroke in ((storage, "#9aa5b1", 0.6), (tasks, "#1f6fb2", 2.0)):
        across, down = _cuts(rows, grid[0]), _cuts(cols, grid[1])
        if len(across) > _MAX_LINES or len(down) > _MAX_LINES:
            parts.append(
                f'<rect x="0" y="0" width="{width:.1f}" height="{height:.1f}" fill="{colour}" opacity="0.25"/>'
            )
            continue
        parts += [
            f'<line x1="0" y1="{r * height / rows:.1f}" x2="{width:.1f}" y2="{r * height / rows:.1f}" '
            f'stroke="{colour}" stroke-width="{stroke}"/>'
            for r in across
        ]
        parts += [
            f'<line x1="{c * width / cols:.1f}" y1="0" x2="{c * width / cols:.1f}" y2="{height:.1f}" '
            f'stroke="{colour}" stroke-width="{stroke}"/>'
            for c in down
        ]
    parts.append(
        f'<rect x="0" y="0" width="{width:.1f}" height="{height:.1f}" fill="none" stroke="#1f6fb2" stroke-width="2"/>'
    )
    parts.append("</svg>")
    return "".join(parts)


def grid_figure(shape: Sequence[int], storage_chunks: Sequence[int] | None, task_chunks: Sequence[int] | None) -> str:
    """:func:`grid_svg` with its legend, as an HTML block."""
    axes = "last two axes" if len(shape) > 2 else "the array"
    legend = (
        f"<small>{escape(axes)}: storage chunks (grey) inside task chunks (blue)"
        f"{'' if storage_chunks is not None else '; stored contiguously'}</small>"
    )
    svg = grid_svg(shape, storage_chunks=storage_chunks, task_chunks=task_chunks)
    return f"<div style='display:inline-block;margin:4px 12px 4px 0'>{svg}<br>{legend}</div>"
