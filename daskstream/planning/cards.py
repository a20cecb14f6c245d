"""Where a planner result finds its notebook card: the planner draws nothing, :mod:`daskstream.views` does.

A notebook (Jupyter, marimo, Panel, nbconvert) asks an object for ``_repr_html_``
when it shows it. The planner's results answer with the view
:mod:`daskstream.views` gives here for their type, built when asked; until that
module is imported (``import daskstream`` imports it) they answer ``None``
and the notebook shows their one-line text instead. Nothing outside
daskstream -- IPython's formatters included -- is changed by it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Each planner result's type and the function that draws its card (filled by daskstream.views).
CARDS: dict[type, Callable[[Any], str]] = {}


def card_of(result: Any) -> str | None:
    """``result``'s HTML card, or ``None`` where no view for its type is known."""
    view = CARDS.get(type(result))
    return None if view is None else view(result)
