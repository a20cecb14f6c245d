"""The library's advice in the command line's words.

daskstream's errors and warnings are written for the Python API: they say
``pass overwrite=True``, ``bins=20 needs range=(low, high)`` or ``use
session('processes')``. A person at the shell typed flags, so the command
line shows the same advice with the flags of the command that was run
(``pass --overwrite``, ``--bins 20 needs --range LOW HIGH``, ``use
--scheduler processes``). The messages carry the arguments they name as
structure (:mod:`daskstream.advice`), so only those parts are respelled and
the prose is left as written; an argument the command does not take is shown
as the library wrote it.

>>> import click
>>> from daskstream.advice import keyword, passing, said
>>> @click.command()
... @click.option("--range", "bin_range", nargs=2, type=float)
... @click.option("--bins", type=int)
... @click.option("--overwrite", is_flag=True)
... def command(bin_range, bins, overwrite): ...
>>> message = said(keyword("bins", 20), " needs ", keyword("range", text="(low, high)"), "; or ",
...                passing("overwrite", True))
>>> in_cli_words(message, command)
'--bins 20 needs --range LOW HIGH; or pass --overwrite'
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import click

from daskstream.advice import Argument, Said
from daskstream.errors import DaskstreamError


def _options(command: click.Command) -> dict[str, tuple[click.Option, str]]:
    """The command's options, and the flag to type, by the keywords the library may name them with.

    Both a flag's spelling (``--memory-budget``: memory_budget, typed as
    that flag even where ``--budget`` is its other name) and the parameter
    it sets (``--no-resume`` sets resume) are taken.
    """
    options: dict[str, tuple[click.Option, str]] = {}
    for param in command.params:
        if isinstance(param, click.Option):
            for opt in param.opts:
                if opt.startswith("--"):
                    options.setdefault(opt[2:].replace("-", "_"), (param, opt))
    for param in command.params:
        if isinstance(param, click.Option) and param.name:
            options.setdefault(param.name, (param, _long(param)))
    return options


def _long(option: click.Option) -> str:
    return next(opt for opt in option.opts if opt.startswith("--"))


def _flag(option: click.Option, flag: str, value: str) -> tuple[str, bool] | None:
    """A flag option given ``True``/``False``: the flag to type, and whether that value means leaving it out."""
    if not option.is_flag or value not in ("True", "False"):
        return None
    wanted = value == "True"
    negative = next((opt for opt in option.secondary_opts if opt.startswith("--")), None)
    if bool(option.flag_value) is wanted:
        return flag, False
    if negative is not None:
        return negative, False
    return flag, True


def _shown(option: click.Option, flag: str, value: str | None) -> str:
    """``flag`` with ``value`` (Python source text) as it is typed at the shell."""
    if value is None:
        return flag
    if value[:1] in "([" and value[-1:] in ")]":
        parts = [part.strip().strip("'\"") for part in value[1:-1].split(",") if part.strip()]
        # Placeholders (low, high) read as the metavars of help texts; numbers stay numbers.
        shown = [part.upper() if part.isidentifier() else part for part in parts]
        # An option of several values takes them as words (--range 0 1); one of one value, as a list (--chunks 5,5).
        return " ".join([flag, *shown]) if option.nargs > 1 else f"{flag} {','.join(shown)}"
    text = value.strip("'\"")
    return f"{flag} {text}" if text else f"{flag} ''"


@contextlib.contextmanager
def spelled(**flags: str) -> Iterator[None]:
    """Say which of the command's flags the keywords of the library call inside stand for, where the command's
    own names would mislead: ``with spelled(dataset="--target-dataset"): ds.store(...)``, so that a store's
    ``dataset=`` advice names the target's flag, not the source's ``--dataset``. Kept on the errors raised
    inside (``cli_flags``), for :func:`in_cli_words`."""
    try:
        yield
    except DaskstreamError as exc:
        exc.cli_flags = {**flags, **getattr(exc, "cli_flags", {})}  # type: ignore[attr-defined]
        raise


def in_cli_words(message: str, command: click.Command | None, flags: dict[str, str] | None = None) -> str:
    """``message`` with the arguments it names (a :class:`~daskstream.advice.Said`'s parts) that are options
    of ``command`` written as its flags; ``flags``: arguments that stand for other flags of it than their
    names (see :func:`spelled`). Plain text is returned as it is."""
    if command is None or not isinstance(message, Said):
        return str(message)
    options = _options(command)
    for name, flag in (flags or {}).items():
        option = next((p for p in command.params if isinstance(p, click.Option) and flag in p.opts), None)
        if option is not None:
            options[name] = (option, flag)
    return "".join(_typed(part, options) if isinstance(part, Argument) else part for part in message.parts)


def _typed(argument: Argument, options: dict[str, tuple[click.Option, str]]) -> str:
    """``argument`` as it is typed at the shell, or as the library wrote it where the command lacks it."""
    found = options.get(argument.name)
    if found is None:
        return str(argument)
    option, flag = found
    if argument.form == "name":
        return flag
    if argument.form == "scheduler":
        return _shown(option, flag, argument.value)
    verb = "pass " if argument.form == "passing" else ""
    as_flag = _flag(option, flag, argument.value or "")
    if as_flag is None:
        return verb + _shown(option, flag, argument.value)
    typed, left_out = as_flag
    if left_out:
        return f"leave out {typed}" if verb else f"without {typed}"
    return verb + typed


__all__ = ["in_cli_words", "spelled"]
