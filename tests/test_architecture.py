"""The package's structure: its layers, no import cycles, a pure planner, and imports where they belong.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``); import-linter
builds the import graph from every import statement, inside functions too.
"""

from __future__ import annotations

import ast
import pathlib
import tomllib

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


def test_the_import_contracts_are_kept(capsys):
    # Layers, a pure planner and no cycles between sibling modules: see pyproject.toml.
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
    # Modules are split by responsibility; one past about 500 lines states why it is one.
    if len(path.read_text().splitlines()) <= 500:
        return
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert "longer than most modules" in docstring.lower(), f"{path.relative_to(ROOT)}: split it, or say why not"


def test_the_checks_catch_what_they_are_for():
    upward = ast.parse("def f():\n    from daskstream.arrays import open\n")
    optional = ast.parse("def f():\n    try:\n        import numba\n    except ImportError:\n        pass\n")
    ((node, guarded),) = _function_level_imports(upward)
    assert (_top_module(node), guarded) == ("daskstream", False)
    ((node, guarded),) = _function_level_imports(optional)
    assert guarded
