"""Bad input on the ``daskstream`` command line: one line on stderr, ``daskstream: error: ...``, exit status 2.

Every case runs the real command (click's CliRunner in this process, or a
subprocess) on real files, and checks what a user sees: the exit status, that
stderr is exactly one line and no traceback, and that the line names the input.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from daskstream.advice import keyword, message_of, named, passing, said, scheduler
from daskstream.cli import main
from daskstream.cli.words import in_cli_words


@pytest.fixture
def npy(tmp_path):
    """A small float64 .npy file, 100 x 10."""
    path = tmp_path / "small.npy"
    np.save(path, np.arange(1000, dtype="f8").reshape(100, 10))
    return str(path)


# click 8.2 keeps stderr apart from stdout always; 8.1 only when asked (a keyword 8.2 no longer takes).
_SEPARATE_STDERR = {"mix_stderr": False} if "mix_stderr" in inspect.signature(CliRunner).parameters else {}


def invoke(*args: str):
    return CliRunner(**_SEPARATE_STDERR).invoke(main, list(args))


def assert_one_line_error(result, *expected: str) -> str:
    """The command failed with status 2 and one ``daskstream: error:`` line holding each of ``expected``."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert line.startswith("daskstream: error: "), line
    for text in expected:
        assert text in line, (text, line)
    assert result.stdout == ""
    # Advice speaks of flags: no Python keyword of an option the commands take, no session(...).
    assert not _PYTHON_ADVICE.search(line), line
    return line


_PYTHON_ADVICE = re.compile(
    r"(?<![\w.])(overwrite|resume|range|q|bins|memory_budget|scheduler|adaptive|axis|op|dataset|chunks|"
    r"compressor|codec|level|zarr_format|inner_chunks|target_dataset)=(?!=)|session\("
)


# --- usage errors: click's own, for every command and nested group -------------------------------


USAGE_ERRORS = [
    (["reduce", "{npy}", "--op", "sum", "--bogus"], ["no such option", "--bogus", "(see daskstream reduce --help)"]),
    (["reduce"], ["missing argument 'PATH'", "(see daskstream reduce --help)"]),
    (["reduce", "{npy}"], ["missing option '--op'"]),
    (["reduce", "{npy}", "--op", "sum", "--axis", "first"], ["--axis first", "names no dimensions", "0 to 1"]),
    (["reduce", "{npy}", "--op", "quantile", "--q", "half"], ["'--q'", "'half' is not a valid float"]),
    (["reduce", "{npy}", "--op", "histogram", "--range", "0"], ["'--range'", "2 arguments", "reduce --help"]),
    (["reduce", "{npy}", "--op", "sum", "surplus"], ["unexpected extra argument (surplus)"]),
    (["describe", "{npy}", "--bins", "ten"], ["'--bins'", "'ten'", "(see daskstream describe --help)"]),
    (["convert", "{npy}", "out.zarr", "--codec", "brotli"], ["'--codec'", "'brotli' is not one of", "convert --help"]),
    (["convert", "{npy}", "out.zarr", "--level", "high"], ["'--level'", "'high' is not a valid integer"]),
    (["plan", "{npy}", "--threads", "0"], ["'--threads'", "0 is not in the range"]),
    (["store", "{npy}", "out.zarr", "--zarr-format", "4"], ["'--zarr-format'", "'4'"]),
    (["tune"], ["give PATH to tune, or --clear", "(see daskstream tune --help)"]),
    (["demo", "--formats", "tiff"], ["'--formats'", "tiff"]),
    (["frobnicate"], ["no such command 'frobnicate'", "(see daskstream --help)"]),
    (["--bogus"], ["no such option", "--bogus", "(see daskstream --help)"]),
    (["cluster", "frobnicate"], ["no such command 'frobnicate'", "(see daskstream cluster --help)"]),
    (["cluster", "check"], ["missing argument 'FILE'", "(see daskstream cluster check --help)"]),
    (["cluster", "check", "a.yaml", "--bogus"], ["no such option", "--bogus", "cluster check --help"]),
]


@pytest.mark.parametrize(
    ("args", "expected"), USAGE_ERRORS, ids=[" ".join(args).replace("{npy}", "FILE") for args, _ in USAGE_ERRORS]
)
def test_usage_errors_are_one_line_naming_the_input_and_the_help(npy, args, expected):
    result = invoke(*(arg.format(npy=npy) for arg in args))
    line = assert_one_line_error(result, *expected)
    # The line reads as a sentence after "error:", not click's "Error: Invalid value...".
    assert not line.startswith("daskstream: error: Error")
    assert "Usage:" not in result.output


def test_the_installed_command_prints_one_line_for_a_usage_error(npy):
    done = subprocess.run(
        [sys.executable, "-m", "daskstream", "reduce", npy, "--op", "sum", "--bogus"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("daskstream: error: no such option")
    assert "--bogus" in line
    assert "reduce --help" in line


@pytest.mark.parametrize("args", [["--help"], ["reduce", "--help"], ["cluster", "--help"], ["cluster", "check", "-h"]])
def test_help_is_still_click_help_on_stdout(args):
    result = invoke(*args)
    assert result.exit_code == 0
    assert result.stdout.startswith("Usage: daskstream")
    assert "Options:" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("args", [[], ["cluster"]], ids=["main", "cluster"])
def test_a_bare_group_still_shows_its_help(args):
    result = invoke(*args)
    assert "Usage: daskstream" in result.output
    assert "Commands:" in result.output


def test_a_multi_line_error_message_is_printed_on_one_line(tmp_path):
    # YAML parsers describe a syntax error over several lines, with a caret under the column.
    broken = tmp_path / "broken.yaml"
    broken.write_text("daskstream:\n  cluster: local\n  local: {n-workers: 2\n")
    line = assert_one_line_error(invoke("cluster", "check", str(broken)), "broken.yaml", "not valid YAML")
    assert "^" not in line


# --- memory budgets ------------------------------------------------------------------------------


BUDGET_COMMANDS = {
    "reduce": ["reduce", "{npy}", "--op", "sum", "--quiet"],
    "describe": ["describe", "{npy}", "--quiet"],
    "plan": ["plan", "{npy}"],
    "convert": ["convert", "{npy}", "{out}", "--quiet"],
}


@pytest.mark.parametrize(
    ("budget", "says"),
    [
        ("1e400", "not a finite size"),
        ("-1e400", "not a finite size"),
        ("inf", "not a finite size"),
        ("nan", "not a finite size"),
        ("1e30", "more than 1 EiB"),
        ("99999999999999999999999", "more than 1 EiB"),
        ("", "is empty"),
        ("0", "more than 0 bytes"),
        ("lots", "not a size"),
    ],
)
@pytest.mark.parametrize("command", sorted(BUDGET_COMMANDS))
def test_bad_budgets_are_refused_on_one_line_by_every_command(npy, tmp_path, command, budget, says):
    out = tmp_path / "out.zarr"
    args = [arg.format(npy=npy, out=out) for arg in BUDGET_COMMANDS[command]]
    result = invoke(*args, "--budget", budget)
    line = assert_one_line_error(result, f"--memory-budget {budget or repr('')} ", says, '"512MiB"')
    assert "memory_budget" not in line
    assert not out.exists()


@pytest.mark.parametrize("command", sorted(BUDGET_COMMANDS))
def test_a_budget_within_1_eib_is_taken(npy, tmp_path, command):
    args = [arg.format(npy=npy, out=tmp_path / "out.zarr") for arg in BUDGET_COMMANDS[command]]
    result = invoke(*args, "--budget", "1024PiB")
    assert result.exit_code == 0, result.stderr


def test_demo_refuses_an_infinite_size_on_one_line(tmp_path):
    assert_one_line_error(
        invoke("demo", "--size", "1e400", "--dir", str(tmp_path)), "--size 1e400", "not a finite size"
    )
    assert list(tmp_path.iterdir()) == []


# --- histograms ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["describe", "{npy}", "--bins", "1000000000000", "--range", "0", "1"],
        ["reduce", "{npy}", "--op", "histogram", "--bins", "1000000000000", "--range", "0", "1"],
        ["reduce", "{npy}", "--op", "histogram", "--bins", "1000000000000"],
        ["reduce", "{npy}", "--op", "histogram", "--bins", str(2**70), "--range", "0", "1"],
    ],
    ids=["describe", "reduce-with-range", "reduce-without-range", "reduce-2**70"],
)
def test_too_many_bins_are_refused_before_allocating_their_edges(npy, args):
    result = invoke(*(arg.format(npy=npy) for arg in args), "--budget", "64MiB", "--quiet")
    line = assert_one_line_error(result, "--bins ", "--memory-budget 64.00 MiB", "give fewer bins")
    assert "TiB" in line or "PiB" in line  # the bytes the bins need


@pytest.mark.parametrize(
    ("low", "high", "says"),
    [
        ("0", "nan", "must be finite"),
        ("nan", "1", "must be finite"),
        ("-inf", "inf", "must be finite"),
        ("0", "inf", "must be finite"),
        ("1", "0", "the first value must not exceed the second"),
        ("-1e308", "1e308", "wider than the largest float64"),
    ],
)
@pytest.mark.parametrize("command", ["reduce", "describe"])
def test_a_range_that_is_not_two_finite_ordered_numbers_is_refused(npy, command, low, high, says):
    args = ["reduce", npy, "--op", "histogram"] if command == "reduce" else ["describe", npy]
    result = invoke(*args, "--bins", "10", "--range", low, high, "--quiet")
    line = assert_one_line_error(result, "--range", says, "e.g. --range 0 1")
    assert "range=" not in line  # the command line's flag, not Python's keyword


# --- advice in the command line's words ----------------------------------------------------------


def test_advice_names_the_commands_flags_not_pythons_keywords(npy, tmp_path):
    line = assert_one_line_error(invoke("reduce", npy, "--op", "quantile", "--quiet"), "--op quantile needs --q")
    assert "q=" not in line
    target = str(tmp_path / "out.zarr")
    assert invoke("store", npy, target, "--quiet").exit_code == 0
    other = tmp_path / "other.npy"
    np.save(other, np.zeros((7, 3)))
    line = assert_one_line_error(invoke("store", str(other), target, "--quiet"), "pass --overwrite")
    assert "overwrite=True" not in line
    # A store's dataset= is the target's: its flag is --target-dataset, not the source's --dataset.
    h5 = str(tmp_path / "out.h5")
    line = assert_one_line_error(invoke("store", npy, h5, "--quiet"), "or --target-dataset /name")
    assert " --dataset" not in line


@pytest.mark.parametrize(
    ("command", "message", "python", "shell"),
    [
        (
            "reduce",
            said("reduce the opened array, or ", passing("adaptive", False)),
            "reduce the opened array, or pass adaptive=False",
            "reduce the opened array, or leave out --adaptive",
        ),
        (
            "reduce",
            said("use ", scheduler("processes"), " or a cluster"),
            "use session('processes') or a cluster",
            "use --scheduler processes or a cluster",
        ),
        # Resuming is the command line's default: the way to it is to leave out --no-resume.
        (
            "store",
            said(passing("resume", True), " to finish it"),
            "pass resume=True to finish it",
            "leave out --no-resume to finish it",
        ),
        (
            "store",
            said(passing("resume", False), " to start again"),
            "pass resume=False to start again",
            "pass --no-resume to start again",
        ),
        (
            "store",
            said("with ", keyword("compressor", "default")),
            "with compressor='default'",
            "with --compressor default",
        ),
        (
            "plan",
            said(keyword("memory_budget", text="2GiB"), " is too small"),
            "memory_budget=2GiB is too small",
            "--memory-budget 2GiB is too small",
        ),
        (
            "plan",
            said("give ", named("memory_budget"), " as bytes"),
            "give memory_budget as bytes",
            "give --memory-budget as bytes",
        ),
        # A list for an option of one value is typed as one word; for an option of two, as two.
        ("convert", said(keyword("chunks", (5, 5))), "chunks=(5, 5)", "--chunks 5,5"),
        ("reduce", said(keyword("range", text="(low, high)")), "range=(low, high)", "--range LOW HIGH"),
        # An argument the command does not take, and the prose around arguments, are left as written.
        ("reduce", said(passing("dtype"), " to map_blocks"), "pass dtype= to map_blocks", "pass dtype= to map_blocks"),
        (
            "reduce",
            said("x.chunks=(1, 2), a==b and overwrite=True"),
            "x.chunks=(1, 2), a==b and overwrite=True",
            "x.chunks=(1, 2), a==b and overwrite=True",
        ),
        # Plain text (another library's message) is never respelled.
        ("store", "pass overwrite=True", "pass overwrite=True", "pass overwrite=True"),
    ],
)
def test_library_advice_is_shown_with_the_commands_flags(command, message, python, shell):
    assert str(message) == python
    assert in_cli_words(message, main.commands[command]) == shell


def test_advice_survives_pickling_and_wrapping():
    """Errors raised in a worker process reach the command through pickle; a message may be wrapped in another."""
    import pickle

    from daskstream.errors import TargetExistsError, TargetWriteError

    error = pickle.loads(pickle.dumps(TargetExistsError(said("out.zarr exists; ", passing("overwrite", True)))))
    wrapped = said("store failed: ", error, "; or choose another target")
    assert in_cli_words(message_of(error), main.commands["store"]) == "out.zarr exists; pass --overwrite"
    assert in_cli_words(wrapped, main.commands["store"]) == (
        "store failed: out.zarr exists; pass --overwrite; or choose another target"
    )
    # An OSError keeps its message as its second argument.
    write = pickle.loads(pickle.dumps(TargetWriteError(28, said("disk full; ", passing("overwrite", True)))))
    assert in_cli_words(message_of(write), main.commands["store"]) == "disk full; pass --overwrite"


def _cli_keywords() -> set[str]:
    """Every name the command line's options answer to, as the library's keywords would spell them."""
    import click

    def commands(command):
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                yield from commands(sub)
        else:
            yield command

    names = set()
    for command in commands(main):
        for param in command.params:
            if isinstance(param, click.Option):
                names |= {opt[2:].replace("-", "_") for opt in param.opts if opt.startswith("--")} | {param.name}
    return names


def test_no_library_message_spells_a_command_line_option_as_plain_text():
    """A message that names an argument the command line also has builds it as an Argument (daskstream.advice),
    so that the command shows it as its flag: text that spells it (``"pass overwrite=True"``) is found here.

    Python calls in messages (``ds.open(..., chunks=...)``), reprs and docstrings are not advice to respell.
    """
    import ast
    from pathlib import Path

    import daskstream

    names = _cli_keywords()
    alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    spelled_as_keyword = re.compile(rf"(?<![\w.=\-])({alternatives})=(?!=)")
    # Parameter names with an underscore, which prose does not use: "raise memory_budget".
    spelled_as_name = re.compile(rf"(?<![\w.\-])({'|'.join(n for n in names if '_' in n)})(?![\w=(])")
    python_call = re.compile(r"[\w.]+\([^()]*\)")
    builders = {"keyword", "passing", "named", "scheduler"}
    package = Path(daskstream.__file__).parent
    # Where "{key}=" is a key of a cluster file or of dask's configuration, or HTML, not a keyword argument.
    settings_keys = {
        str(package / name)
        for name in (
            "runtime/clusters/setting_checks.py",
            "runtime/clusters/consent.py",
            "runtime/resources.py",
            "sources/listing.py",
        )
    }
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).parts[0] in ("cli", "advice.py"):
            continue
        tree = ast.parse(path.read_text())
        skipped = set()
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                skipped.add(id(body[0].value))  # a docstring
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in builders:
                skipped.update(id(arg) for arg in ast.walk(node))
            if isinstance(node, ast.FunctionDef) and node.name in ("__repr__", "_repr_html_"):
                skipped.update(id(sub) for sub in ast.walk(node))
        for node in ast.walk(tree):
            # f"{name}={value}": a keyword whose name is known only when the message is made.
            if isinstance(node, ast.JoinedStr) and id(node) not in skipped and str(path) not in settings_keys:
                for before, after in zip(node.values, node.values[1:]):
                    text = str(after.value) if isinstance(after, ast.Constant) else ""
                    if isinstance(before, ast.FormattedValue) and text.startswith("=") and not text.startswith("=="):
                        found.append(f"{path.relative_to(package)}:{node.lineno}: {ast.unparse(node)[:80]}")
            if id(node) in skipped or not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            text = python_call.sub("", node.value)
            if text.isidentifier() or text.startswith("<"):
                continue  # a key, an attribute's name, markup
            if spelled_as_keyword.search(text) or spelled_as_name.search(text) or "session('" in text:
                found.append(f"{path.relative_to(package)}:{node.lineno}: {node.value!r}")
    assert not found, "\n".join(found)


# --- codecs and their levels ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("codec", "level", "levels"),
    [
        ("zstd", "1000", "-131072 to 22"),
        ("zstd", "23", "-131072 to 22"),
        ("zstd", "-131073", "-131072 to 22"),
        ("lz4", "10", "0 to 9"),
        ("lz4", "-1", "0 to 9"),
        ("gzip", "10", "0 to 9"),
        ("gzip", "99999999999999999999", "0 to 9"),
    ],
)
@pytest.mark.parametrize("target", ["out.zarr", "out.h5::/data"])
def test_a_level_outside_the_codecs_range_names_the_codec_and_its_range(npy, tmp_path, target, codec, level, levels):
    out = tmp_path / target
    result = invoke("convert", npy, str(out), "--codec", codec, "--level", level, "--quiet")
    assert_one_line_error(result, "'--level'", level, f"{codec}'s levels, {levels}", "convert --help")
    # Refused before anything was written.
    assert list(tmp_path.iterdir()) == [tmp_path / "small.npy"]


# --- chunk sizes, ints, folders --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chunks", "says"),
    [
        ("99999999999999999999,5", "99999999999999999999 in '99999999999999999999,5' is longer than any axis"),
        ("5,-99999999999999999999", "-99999999999999999999"),
        (",", "',' is not a list of sizes"),
        ("5,x", "'5,x' is not a list of sizes"),
        ("0,5", "0 is not a positive size"),
    ],
)
def test_bad_chunk_sizes_are_refused_on_one_line(npy, tmp_path, chunks, says):
    result = invoke("convert", npy, str(tmp_path / "out.zarr"), "--chunks", chunks, "--quiet")
    line = assert_one_line_error(result, says)
    assert "ufunc" not in line
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize(
    ("args", "option", "says"),
    [
        (["reduce", "{npy}", "--op", "var", "--ddof", "-1"], "'--ddof'", "-1 is not in the range x>=0"),
        (["reduce", "{npy}", "--op", "var", "--ddof", str(10**20)], "'--ddof'", "more than 2**63 - 1"),
        (["plan", "{npy}", "--threads", str(10**20)], "'--threads'", "more than 2**63 - 1"),
        (["plan", "{npy}", "--workers", str(10**20)], "'--workers'", "more than 2**63 - 1"),
    ],
    ids=["negative-ddof", "huge-ddof", "huge-threads", "huge-workers"],
)
def test_ints_beyond_int64_or_their_range_are_refused(npy, args, option, says):
    assert_one_line_error(invoke(*(arg.format(npy=npy) for arg in args)), option, says)


def test_demo_refuses_a_size_its_disk_cannot_hold_before_writing(tmp_path):
    folder = tmp_path / "demo"
    line = assert_one_line_error(
        invoke("demo", "--size", "1024PiB", "--formats", "npy", "--dir", str(folder)), "'--size'", "'1024PiB'"
    )
    assert "free there" in line
    assert not folder.exists()


def test_demo_refuses_a_file_as_its_folder(npy):
    assert_one_line_error(invoke("demo", "--size", "1MiB", "--dir", npy), "'--dir'", npy, "is a file")


def test_demo_says_when_it_cannot_make_its_folder(npy):
    # A folder under a regular file cannot be made.
    folder = f"{npy}/inside"
    assert_one_line_error(
        invoke("demo", "--size", "1MiB", "--dir", folder), "'--dir'", f"cannot make the folder {folder!r}"
    )
