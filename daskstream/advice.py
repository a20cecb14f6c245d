"""Messages that name arguments, kept as structure so each caller spells them its own way.

daskstream's errors and warnings tell the user what to pass: ``pass
overwrite=True``, ``bins=20 needs range=(low, high)``, ``use
session('processes')``. Written as plain text, that advice is right for the
Python API and wrong at the shell, where the same thing is ``--overwrite``,
``--range LOW HIGH`` or ``--scheduler processes``. So a message that names an
argument is built with :func:`said` from text and :class:`Argument` parts:
``str()`` of it is the Python spelling, and the command line renders the same
parts with its flags (``daskstream.cli.words``), without reading the prose.

>>> message = said("the target exists; ", passing("overwrite", True), " to replace it")
>>> str(message)
'the target exists; pass overwrite=True to replace it'
>>> [part.name for part in message.arguments]
['overwrite']
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from daskstream.errors import shown

__all__ = ["Argument", "Said", "joined", "keyword", "message_of", "named", "passing", "said", "scheduler"]

# How an argument appears in a message:
# - "keyword": ``name=value`` (or ``name=`` when only the argument is named);
# - "passing": advice to pass it, ``pass name=value``; at the shell a flag's default is passed by leaving
#   the flag out, so this form may read "leave out --flag" there;
# - "name": the parameter's name alone (``raise memory_budget``);
# - "scheduler": a scheduler chosen in Python, ``session('processes')``.
Form = Literal["keyword", "passing", "name", "scheduler"]


@dataclass(frozen=True)
class Argument:
    """One argument a message names.

    Parameters
    ----------
    name
        The Python keyword (``"overwrite"``, ``"memory_budget"``).
    value
        The value as Python source text (``"True"``, ``"'skip'"``, ``"(low, high)"``), or None when
        the message names the argument without a value.
    form
        How the message uses it; see :data:`Form`.
    """

    name: str
    value: str | None = None
    form: Form = "keyword"

    def __str__(self) -> str:
        if self.form == "name":
            return self.name
        if self.form == "scheduler":
            return f"session({self.value})"
        text = f"{self.name}={self.value or ''}"
        return f"pass {text}" if self.form == "passing" else text


# No value given: the argument is named alone (``dataset=``). None is a value (``compressor=None``).
_NOTHING = object()


def _value_text(value: Any, text: str | None) -> str | None:
    """The value as a message writes it: ``text`` as given (a placeholder), else its repr, shortened."""
    if text is not None:
        return text
    if value is _NOTHING:
        return None
    return "..." if value is Ellipsis else shown(value)


def keyword(name: str, value: Any = _NOTHING, *, text: str | None = None) -> Argument:
    """``name=value`` in a message: the argument given (``bins=5 must be positive``) or advised.

    ``text`` is the value as written when it is a placeholder rather than a value (``"(low, high)"``).

    >>> str(keyword("bins", 5)), str(keyword("range", text="(low, high)")), str(keyword("dataset"))
    ('bins=5', 'range=(low, high)', 'dataset=')
    """
    return Argument(name, _value_text(value, text), "keyword")


def passing(name: str, value: Any = _NOTHING, *, text: str | None = None) -> Argument:
    """``pass name=value``: advice to pass an argument.

    >>> str(passing("on_error", "skip"))
    "pass on_error='skip'"
    """
    return Argument(name, _value_text(value, text), "passing")


def named(name: str) -> Argument:
    """A parameter named on its own: ``raise memory_budget``.

    >>> str(named("memory_budget"))
    'memory_budget'
    """
    return Argument(name, None, "name")


def scheduler(kind: str) -> Argument:
    """A scheduler to run on, as Python chooses it: ``session('processes')``.

    >>> str(scheduler("processes"))
    "session('processes')"
    """
    return Argument("scheduler", repr(kind), "scheduler")


class Said(str):
    """A message as its Python text, with the parts it was built from (``parts``) for other renderings.

    It is a ``str``, so it goes wherever a message goes (an exception's argument, ``warnings.warn``) and
    pickles with it to and from worker processes.
    """

    parts: tuple[str | Argument, ...]

    def __new__(cls, parts: Iterable[str | Argument]) -> Said:
        kept = tuple(parts)
        made = super().__new__(cls, "".join(map(str, kept)))
        made.parts = kept
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        return (Said, (self.parts,))

    def __add__(self, other: str) -> Said:
        # Text added keeps the parts: ``message + "; " + advice`` is still a message that names its arguments.
        return said(self, other)

    def __radd__(self, other: str) -> Said:
        return said(other, self)

    @property
    def arguments(self) -> tuple[Argument, ...]:
        """The arguments the message names, in order."""
        return tuple(part for part in self.parts if isinstance(part, Argument))


def said(*parts: str | Argument | BaseException) -> Said:
    """A message from text, :class:`Argument` parts and other messages (a ``Said`` or an exception, whose
    parts are kept: ``said(f"{path}: ", error)`` keeps the advice of ``error``).

    >>> str(said(keyword("bins", 5), " needs ", keyword("range", text="(low, high)")))
    'bins=5 needs range=(low, high)'
    """
    flat: list[str | Argument] = []
    for part in parts:
        if isinstance(part, BaseException):
            part = message_of(part)
        if isinstance(part, Said):
            flat.extend(part.parts)
        elif isinstance(part, Argument):
            flat.append(part)
        else:
            flat.append(str(part))
    return Said(flat)


def joined(messages: Iterable[str | Argument], separator: str) -> Said:
    """``separator.join(messages)``, keeping the parts of those that are :class:`Said` or :class:`Argument`.

    >>> joined([said(keyword("bins", 5)), "plain"], "; ")
    'bins=5; plain'
    """
    parts: list[str | Argument | BaseException] = []
    for index, message in enumerate(messages):
        parts.extend([separator, message] if index else [message])
    return said(*parts)


def message_of(error: BaseException) -> str:
    """``error``'s message: the :class:`Said` it was raised with, where its text is that message, else its
    ``str()``."""
    text = str(error)
    # An OSError's message is its second argument (``OSError(errno, message)``).
    return next((arg for arg in error.args if isinstance(arg, Said) and str(arg) == text), text)
