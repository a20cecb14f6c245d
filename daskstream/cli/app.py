"""The ``daskstream`` group: one-line errors and warnings, exit statuses, stopping on signals."""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Any, NoReturn

import click

from daskstream import dependencies
from daskstream.advice import message_of
from daskstream.allocator import cap_malloc_arenas
from daskstream.cli.words import in_cli_words
from daskstream.errors import DaskstreamError, DaskstreamWarning
from daskstream.runtime.progress import close_open_bars
from daskstream.runtime.stopping import (
    Interrupted,
    abandon_running_tasks,
    stop_child_processes,
    stopping_on_signals,
)
from daskstream.starting import finished


class _OneLineError(click.ClickException):
    """A click error (unknown option, missing argument, bad value...) shown as one line.

    click shows usage errors as four lines (usage, a hint, a blank line, the
    error); daskstream's promise is one line on stderr, ``daskstream: error:
    ...``, that names the input, and a pointer to the command's ``--help``.
    """

    def __init__(self, error: click.ClickException) -> None:
        super().__init__(error.format_message())
        self.ctx: click.Context | None = getattr(error, "ctx", None)

    @classmethod
    def of(cls, error: click.ClickException) -> _OneLineError:
        """``error`` as one line, exiting with its status (click's exit_code is a class attribute)."""
        kind = _ONE_LINE_KINDS.get(error.exit_code)
        if kind is None:
            kind = _ONE_LINE_KINDS[error.exit_code] = type(cls.__name__, (cls,), {"exit_code": error.exit_code})
        return kind(error)

    def show(self, file: Any = None) -> None:
        line = _one_line(_sentence_start(self.message))
        if self.ctx is not None:
            line = f"{line} (see {self.ctx.command_path} --help)"
        click.echo(f"daskstream: error: {line}", file=file, err=file is None)


# One subclass of _OneLineError per exit status seen, made once.
_ONE_LINE_KINDS: dict[int, type[_OneLineError]] = {}


# click 8.2 raises this usage error where a bare group shows its help; 8.1 exits instead, and has no
# such class (an empty tuple catches nothing).
_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


@contextlib.contextmanager
def _one_line_click_errors() -> Any:
    """Re-raise click's errors as :class:`_OneLineError`, which click then shows and exits with."""
    try:
        yield
    except _NO_ARGS_IS_HELP:
        raise  # a bare group shows its help, as click does
    except _OneLineError:
        raise
    except click.ClickException as exc:
        raise _OneLineError.of(exc) from exc


class _Command(click.Command):
    """A command whose parsing errors name it, and whose errors and warnings speak of its flags.

    Parsing errors point to the command's ``--help``; daskstream's errors
    and warnings, written for Python (``pass overwrite=True``), name the
    command's own flags (``pass --overwrite``).
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return _parse_args_naming(super().parse_args, ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DaskstreamError as exc:
            _fail(exc, self)


def _parse_args_naming(parse_args: Any, ctx: click.Context, args: list[str]) -> list[str]:
    """``parse_args(ctx, args)``, with ``ctx`` set on the usage errors that click raises without one."""
    try:
        return parse_args(ctx, args)
    except click.UsageError as exc:
        # click's option parser raises some (an option missing its values) without the context.
        if exc.ctx is None:
            exc.ctx = ctx
        raise


class _Group(click.Group):
    """Turns usage errors and daskstream's own errors into one line on stderr and exit status 2.

    Applies to every command of the group and of its subgroups (``daskstream
    cluster ...``), which are of this class too. ``--help`` is shown as click
    shows it.
    """

    # Groups made with @group.group() are _Group too, so their errors read the same.
    group_class = type
    command_class = _Command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return _parse_args_naming(super().parse_args, ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands with their whole first sentence, wrapped (click cuts it short with "...")."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        # The group's own options and arguments are parsed here, before any subcommand is found.
        with _one_line_click_errors():
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        # Finding the subcommand, parsing its options and running it all happen in here.
        with _one_line_click_errors():
            try:
                with stopping_on_signals():
                    result = super().invoke(ctx)
                finished()
                return result
            except DaskstreamError as exc:
                _fail(exc, None)
            except Interrupted as exc:
                # The command ends here: the tasks still running in the pool's threads need not finish first.
                abandon_running_tasks(exc.signum)
                _stopped(exc, ctx.invoked_subcommand)


def _fail(error: DaskstreamError, command: click.Command | None) -> NoReturn:
    """``error`` as one line on stderr, in ``command``'s words where one ran, and exit status 2."""
    flags = getattr(error, "cli_flags", None)
    click.echo(f"daskstream: error: {_one_line(in_cli_words(message_of(error), command, flags))}", err=True)
    sys.exit(2)


# What is kept when a command is stopped, and how to go on.
_AFTER_STOP = {
    "store": "the blocks written so far are kept: run the same command again to resume (it writes only the rest)",
    "convert": "the blocks written so far are kept: run the same command again to resume (it writes only the rest)",
    "tune": "what earlier runs remembered is kept; run the command again to tune",
    "demo": "the sample files written so far are left in --dir when one was given",
}


def _stopped(interrupted: Interrupted, command: str | None) -> NoReturn:
    """A command stopped by SIGINT or SIGTERM: one line saying what is kept, and the shell's exit status."""
    after = _AFTER_STOP.get(command or "", "nothing was written; run the command again to start over")
    # Workers of a process scheduler or a local cluster: a signal to this process alone never reaches them.
    stop_child_processes()
    close_open_bars()
    # A bar drawn but never advanced is left without its newline by tqdm: the line starts over it.
    start = "\r\x1b[K" if sys.stderr.isatty() else "\r"
    click.echo(f"{start}daskstream: stopped by {interrupted.signal_name}; {after}", err=True)
    sys.exit(interrupted.exit_status)


def _one_line(message: str) -> str:
    """``message`` on one line: its lines joined, without lines that only point (a YAML error's ``^``)."""
    lines = (line.strip() for line in message.splitlines())
    return " ".join(line for line in lines if any(char.isalnum() for char in line))


def _sentence_start(message: str) -> str:
    """click's "No such option: ..." as "no such option: ...", to follow "daskstream: error:"."""
    message = message.rstrip(".")
    if len(message) > 1 and message[0].isupper() and message[1].islower():
        return message[0].lower() + message[1:]
    return message


# Named, so that a caller with no program name (click's CliRunner) sees the command's own.
def _print_versions(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(dependencies.report())
        ctx.exit()


@click.group("daskstream", cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="daskstream")
@click.option(
    "--versions",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_versions,
    help="Print the versions of daskstream's dependencies and which optional features are usable, and exit.",
)
def main() -> None:
    """Out-of-core arrays from .npy, HDF5 and Zarr files, with storage-aligned chunks."""
    warnings.showwarning = _one_line_warning
    cap_malloc_arenas()  # this process is daskstream's: its threads share freed memory


_python_showwarning = warnings.showwarning


def _one_line_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None
) -> None:
    """daskstream's warnings as one line on stderr (what to know, not where in daskstream it was said)."""
    if issubclass(category, DaskstreamWarning):
        # Said while a command runs, so its context names the flags the advice should use.
        ctx = click.get_current_context(silent=True)
        click.echo(f"warning: {in_cli_words(_message(message), ctx.command if ctx else None)}", err=True)
        return
    _python_showwarning(message, category, filename, lineno, file, line)


def _message(warning: Warning | str) -> str:
    return message_of(warning) if isinstance(warning, Warning) else warning


def versions_facts() -> dict[str, Any]:
    return {
        "daskstream": dependencies.installed_version("daskstream"),
        "dependencies": {
            d.name: {"installed": d.installed, "needs": d.specifier, "extra": d.extra}
            for d in dependencies.declared()
            if d.extra not in ("test", "bench")
        },
        "usable_extras": dependencies.usable_extras(),
    }
