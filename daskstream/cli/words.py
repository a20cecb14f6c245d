"""The library's advice in the command line's words.

daskstream's errors and warnings are written for the Python API: they say
``pass overwrite=True``, ``bins=20 needs range=(low, high)`` or ``use
session('processes')``. A person at the shell typed flags, so the command
line shows the same advice with the flags of the command that was run
(``pass --overwrite``, ``--bins 20 needs --range LOW HIGH``, ``use
--scheduler processes``). Only keywords that are options of that command are
rewritten; anything else (a keyword the command does not take) is left as
the library wrote it.

>>> import click
>>> @click.command()
... @click.option("--range", "bin_range", nargs=2, type=float)
... @click.option("--bins", type=int)
... @click.option("--overwrite", is_flag=True)
... def command(bin_range, bins, overwrite): ...
>>> in_cli_words("bins=20 needs range=(low, high); or pass overwrite=True", command)
'--bins 20 needs --range LOW HIGH; or pass --overwrite'
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import click

from daskstream.errors import DaskstreamError

# A keyword argument as the library's messages write it: the name, "=", and a value when one follows:
# a parenthesised tuple, a quoted string or a bare word or number. Not preceded by a word character or a
# dot, so attribute paths and comparisons ("a==b") are left alone. "pass " before it is kept apart: the
# way to pass a flag's default at the shell is to leave the flag out.
_KEYWORD = re.compile(
    r"""(?P<verb>\bpass )?(?<![\w.=])(?P<name>[a-z_][a-z0-9_]*)=(?!=)"""
    r"""(?P<value>\([^()]*\)|'[^']*'|"[^"]*"|[\w.+\-]+)?"""
)
_NAME = re.compile(r"(?<![\w.\-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w=(])")
# ``session('processes')`` / ``session("distributed")``: a scheduler chosen in Python.
_SESSION = re.compile(r"""(?:ds\.|daskstream\.)?session\(\s*['"](?P<kind>\w+)['"]\s*\)""")


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


def _shown(flag: str, value: str | None) -> str:
    """``flag`` with ``value`` as it is typed at the shell."""
    if value is None:
        return flag
    if value.startswith("(") and value.endswith(")"):
        parts = [part.strip().strip("'\"") for part in value[1:-1].split(",") if part.strip()]
        # Placeholders (low, high) read as the metavars of help texts; numbers stay numbers.
        shown = [part.upper() if part.isidentifier() else part for part in parts]
        return " ".join([flag, *shown])
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
    """``message`` with the Python keywords that are options of ``command`` written as its flags;
    ``flags``: keywords that stand for other flags of it than their names (see :func:`spelled`)."""
    if command is None:
        return message
    options = _options(command)
    for name, flag in (flags or {}).items():
        option = next((p for p in command.params if isinstance(p, click.Option) and flag in p.opts), None)
        if option is not None:
            options[name] = (option, flag)
    if not options:
        return message

    def keyword(match: re.Match[str]) -> str:
        found = options.get(match["name"])
        if found is None:
            return match[0]
        option, flag = found
        verb = match["verb"] or ""
        as_flag = _flag(option, flag, match["value"] or "")
        if as_flag is None:
            return verb + _shown(flag, match["value"])
        typed, left_out = as_flag
        if left_out:
            return f"leave out {typed}" if verb else f"without {typed}"
        return verb + typed

    def scheduler(match: re.Match[str]) -> str:
        found = options.get("scheduler")
        return match[0] if found is None else f"{found[1]} {match['kind']}"

    def named(match: re.Match[str]) -> str:
        found = options.get(match[0])
        return match[0] if found is None else found[1]

    message = _KEYWORD.sub(keyword, _SESSION.sub(scheduler, message))
    # A parameter named on its own ("give memory_budget as bytes"): only names with an underscore, which
    # prose does not use, so that "range" or "bins" as words stay words.
    return _NAME.sub(named, message)


__all__ = ["in_cli_words", "spelled"]
