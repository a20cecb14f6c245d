"""The package's structure: its layers, no import cycles, a pure planner, and imports where they belong.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``); import-linter
builds the import graph from every import statement, inside functions too.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import pathlib
import tomllib
from collections.abc import Iterator

import pytest
from importlinter.cli import lint_imports

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "daskstream"

# What a function may import where it is used rather than at the top of its module: optional extras,
# a platform's own modules, and the heavy libraries a program that never uses them should not pay to
# import (zarr and distributed add most of a second to `import daskstream`; h5py, hdf5plugin, fsspec
# and numcodecs load native libraries and plugins; jsonschema, some 60 ms, only checks settings files).
DEFERRED = {
    "asyncssh",
    "dask_jobqueue",
    "dask_kubernetes",
    "distributed",
    "fcntl",
    "fsspec",
    "h5netcdf",
    "h5py",
    "hdf5plugin",
    "IPython",
    "jsonschema",
    "ipywidgets",
    "matplotlib",
    "numba",
    "numcodecs",
    "pandas",
    "s3fs",
    "scipy",
    "torch",
    "xarray",
    "zarr",
}


@contextlib.contextmanager
def logging_kept() -> Iterator[None]:
    """Logging as it was before, afterwards: import-linter's command configures it for a process of its own
    (``logging.config.dictConfig``, which disables every logger made so far: daskstream's among them)."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]
    kept = [(logger, logger.disabled, logger.level, logger.propagate, list(logger.handlers)) for logger in loggers]
    root = (logging.root.level, list(logging.root.handlers))
    try:
        yield
    finally:
        for logger, disabled, level, propagate, handlers in kept:
            logger.disabled, logger.level, logger.propagate, logger.handlers = disabled, level, propagate, handlers
        logging.root.level, logging.root.handlers = root


def test_the_import_contracts_are_kept(capsys):
    # Layers, a pure planner and no cycles between sibling modules: see pyproject.toml.
    with logging_kept():
        status = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    report = capsys.readouterr().out
    assert status == 0, report
    assert "BROKEN" not in report


def test_the_planner_takes_from_dask_only_its_byte_helpers():
    # Beside the contract that keeps settings, files and schedulers out of planning/: of dask (one
    # package to import-linter), only dask.utils' size parsing and formatting.
    taken = set()
    for path in (PACKAGE / "planning").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dask":
                taken |= {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                taken |= {alias.name for alias in node.names if alias.name.split(".")[0] == "dask"}
    assert taken <= {"dask.utils.parse_bytes", "dask.utils.format_bytes"}


def test_every_module_is_in_a_layer():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c for c in config["contracts"] if c["type"] == "layers"]
    named = {name.strip() for layer in layers["layers"] for name in layer.split("|")}
    children = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    children |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert children == named


def _function_level_imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Imports inside functions, each with whether a ``try`` around it catches ImportError."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers
        ):
            guarded.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    found: dict[int, tuple[ast.Import | ast.ImportFrom, bool]] = {}
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    found[id(node)] = (node, id(node) in guarded)
    return list(found.values())


def _top_module(node: ast.Import | ast.ImportFrom) -> str:
    if isinstance(node, ast.ImportFrom):
        return "daskstream" if node.level else (node.module or "").split(".")[0]
    return node.names[0].name.split(".")[0]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_inside_functions_are_only_for_optional_or_heavy_dependencies(path):
    misplaced = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
        for node, guarded in _function_level_imports(ast.parse(path.read_text()))
        if not guarded and _top_module(node) not in DEFERRED
    ]
    assert not misplaced, "import these at the top of the module:\n" + "\n".join(misplaced)


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_long_module_says_why_at_its_top(path):
    # Modules are split by responsibility; one past about 500 lines states why it is one, and none passes 600.
    lines = len(path.read_text().splitlines())
    assert lines <= 600, f"{path.relative_to(ROOT)}: {lines} lines; split it by responsibility"
    if lines <= 500:
        return
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert "longer than most modules" in docstring.lower(), f"{path.relative_to(ROOT)}: split it, or say why not"


@pytest.mark.parametrize(
    "folder", sorted(p.parent for p in PACKAGE.rglob("__init__.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_a_package_folder_holds_at_most_twenty_modules(folder):
    # A family of modules sharing a prefix is a subpackage (sources/zarr/, sources/hdf5/...): a reader finds
    # a room by its name, not by scanning forty files.
    modules = sorted(p.name for p in folder.glob("*.py"))
    assert len(modules) <= 20, f"{folder.relative_to(ROOT)} holds {len(modules)} modules; group them by family"


def test_the_checks_catch_what_they_are_for():
    upward = ast.parse("def f():\n    from daskstream.arrays import open\n")
    optional = ast.parse("def f():\n    try:\n        import numba\n    except ImportError:\n        pass\n")
    ((node, guarded),) = _function_level_imports(upward)
    assert (_top_module(node), guarded) == ("daskstream", False)
    ((node, guarded),) = _function_level_imports(optional)
    assert guarded


# Settings stay on one route (as cubed's Spec does): the budget, threads and workers are resolved into one
# Resources or PlanSettings where a call enters daskstream, and passed down; nothing below looks them up again.
RESOLVERS = {
    "detect_resources",
    "machine_resources",
    "planned_cluster_resources",
    "resolve_resources",
    "resolve_settings",
    "resources_for",
    "settings_for",
}

# Modules whose every function may resolve settings or take a raw memory_budget.
RESOLVING_MODULES = {
    "runtime/resources.py": "the resolvers themselves",
    "runtime/session.py": "a session sets daskstream.memory-budget and finds the resources of its place",
    # The command's modules: each command takes its options as typed and calls the public API.
    "cli/options.py": "the sessions every command opens from its --scheduler, --cluster and --memory-budget",
    "cli/planning.py": "the plan and tune commands take their options as typed and call the public API",
    "cli/reductions.py": "the reduce and describe commands take their options as typed and call the public API",
    "cli/stores.py": "the store and convert commands take their options as typed and call the public API",
}

# Functions that may, each an entry point: where a call enters daskstream.
ENTRY_POINTS = {
    "arrays.py:open": "daskstream.open",
    "arrays.py:plan": "daskstream.plan",
    "arrays.py:plan_chunks": "daskstream.plan_chunks",
    "arrays.py:describe": "daskstream.describe",
    "arrays.py:reduce": "daskstream.reduce (adaptive=True: the waves' settings)",
    "arrays.py:store": "daskstream.store (adaptive=True: the waves' settings)",
    "compute/plans.py:plan_compute": "daskstream.plan_compute",
    "compute/describe.py:describe": "daskstream.compute.describe",
    "compute/blockwise.py:map_blocks": "daskstream.map_blocks, which every kernel of daskstream.kernels calls",
    "compute/quantiles.py:median": "daskstream.compute.median",
    "compute/quantiles.py:quantile": "daskstream.compute.quantile",
    "compute/rechunk.py:rechunk": "daskstream.rechunk",
    "compute/reductions.py:histogram": "daskstream.compute.histogram",
    "compute/reductions.py:reduce": "daskstream.compute.reduce",
    "compute/store/__init__.py:store": "daskstream.compute.store",
    "compute/store/codecs.py:choose_codec": "daskstream.choose_codec",
    "compute/limits.py:codec_limit": "daskstream.compute.codec_limit",
    "labelled/backend.py:DaskstreamBackendEntrypoint.open_dataset": "xarray.open_dataset(engine='daskstream')",
    "labelled/dataset.py:open_dataset": "daskstream.open_dataset",
    "streaming/streams.py:stream": "daskstream.stream",
    "tuning/tuner.py:tune": "daskstream.tune",
}


def _resolves(call: ast.Call) -> bool:
    """Whether ``call`` looks settings up: a resolver, the memory-budget setting, or a memory budget parsed."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name in RESOLVERS:
        return True
    settings = isinstance(func, ast.Attribute) and ast.unparse(func.value) in ("config", "dask.config")
    if name in ("get", "setting") and settings:
        first = call.args[0] if call.args else None
        return isinstance(first, ast.Constant) and first.value in ("memory-budget", "daskstream.memory-budget")
    if name == "parse_budget":
        # parse_budget names what it parses "memory_budget" unless told otherwise.
        named = [k.value for k in call.keywords if k.arg == "name"]
        return not named or "memory" in ast.unparse(named[0])
    return False


def _raw_budget(arg: ast.arg) -> bool:
    """A ``memory_budget`` parameter that is not yet a number of bytes (``int | str | None``, or untyped)."""
    return arg.arg == "memory_budget" and not (isinstance(arg.annotation, ast.Name) and arg.annotation.id == "int")


def _settings_looked_up(tree: ast.Module) -> list[tuple[str, int, str]]:
    """``(function, line, what)`` for every call that resolves settings and every raw ``memory_budget``
    parameter in a module; functions named as ``Class.method`` and ``outer.inner``."""
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = f"{scope}.{child.name}" if scope else child.name
                if not isinstance(child, ast.ClassDef):
                    arguments = child.args
                    for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                        if _raw_budget(arg):
                            found.append((inner, child.lineno, "takes a raw memory_budget"))
                visit(child, inner)
                continue
            if isinstance(child, ast.Call) and _resolves(child):
                found.append((scope or "<module>", child.lineno, f"calls {ast.unparse(child.func)}"))
            visit(child, scope)

    visit(tree, "")
    return found


def _settings_lookups_in(package: pathlib.Path) -> dict[str, list[str]]:
    """Each function of ``package`` that resolves settings or takes a raw budget (as ``path:function``), with
    where and how; the modules of :data:`RESOLVING_MODULES` left out."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        if module in RESOLVING_MODULES:
            continue
        for function, line, what in _settings_looked_up(ast.parse(path.read_text())):
            found.setdefault(f"{module}:{function}", []).append(f"{module}:{line}: {function} {what}")
    return found


def test_settings_are_resolved_where_a_call_enters_and_passed_down():
    found = _settings_lookups_in(PACKAGE)
    stray = [where for function, places in found.items() if function not in ENTRY_POINTS for where in places]
    assert not stray, (
        "resolve settings where the call enters daskstream (a public function: add it to ENTRY_POINTS with why) "
        "and pass the Resources or PlanSettings down:\n" + "\n".join(stray)
    )
    # An entry that no longer resolves anything is taken off the list, which stays the list of entry points.
    assert not set(ENTRY_POINTS) - set(found), sorted(set(ENTRY_POINTS) - set(found))


def test_the_settings_check_catches_what_it_is_for():
    below = ast.parse(
        "class Writer:\n"
        "    def window(self, x, memory_budget=None):\n"
        "        return resolve_resources(memory_budget=memory_budget)\n"
        "def size(budget):\n"
        "    return parse_budget(budget) + config.get('memory-budget')\n"
        "def share(memory_budget: int, text):\n"
        "    return memory_budget // 2 + parse_budget(text, name='size')\n"
    )
    assert _settings_looked_up(below) == [
        ("Writer.window", 2, "takes a raw memory_budget"),
        ("Writer.window", 3, "calls resolve_resources"),
        ("size", 5, "calls parse_budget"),
        ("size", 5, "calls config.get"),
    ]
