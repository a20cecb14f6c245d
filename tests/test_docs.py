"""The documentation's code runs as a reader would paste it: each block on its own, in an empty folder.

Every ``python`` block of ``docs/`` and of the README runs in a fresh
interpreter, every ``bash`` block in a fresh shell, with nothing made for it
beforehand: a block that needs a file writes it. Blocks that read an object
store (``s3://``) need a server: tests/objects/test_docs_objects.py runs them
against the one on 127.0.0.1. Output shown to the reader is in ``text`` blocks,
which are not run. The site itself is built with warnings as errors.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([REPO / "README.md", *(p for p in (REPO / "docs").rglob("*.md") if "_build" not in p.parts)])
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.S | re.M)


def code_blocks(page: Path) -> list[tuple[str, str, int]]:
    """``(language, code, line)`` of each runnable block of ``page``."""
    text = page.read_text()
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in BLOCK.finditer(text)]


# Packages a page may use that an installation may lack: its blocks are skipped where they are missing.
OPTIONAL = ("torch", "torchdata", "tensorflow")


def _marks(code: str) -> list:
    if "s3://" in code:
        return [pytest.mark.skip(reason="runs against an S3 server: tests/objects/test_docs_objects.py")]
    if re.search(r"^python3 -m pip install", code, re.M):
        return [pytest.mark.skip(reason="installs the package: CI runs the README's quick start")]
    # Every part of every module imported: daskstream.torch needs torch as much as import torch does.
    imported = {
        part for module in re.findall(r"^\s*(?:import|from) ([\w.]+)", code, re.M) for part in module.split(".")
    }
    missing = [name for name in OPTIONAL if name in imported and importlib.util.find_spec(name) is None]
    return [pytest.mark.skip(reason=f"needs {', '.join(missing)}")] if missing else []


def _cases() -> list:
    return [
        pytest.param(language, code, id=f"{page.relative_to(REPO)}:{line}", marks=_marks(code))
        for page in PAGES
        for language, code, line in code_blocks(page)
    ]


def _run(command: list[str], folder: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(("language", "code"), _cases())
def test_the_block_runs_on_its_own(language, code, tmp_path):
    # Saved as a script and run as one, as a reader would: stricter than ``python -c`` (a process a
    # LocalCluster spawns imports the script again, which runs a cluster only under __main__).
    script = tmp_path / ("block.py" if language == "python" else "block.sh")
    script.write_text(code)
    command = [sys.executable, script.name] if language == "python" else ["bash", "-e", "-o", "pipefail", script.name]
    run = _run(command, tmp_path)
    assert run.returncode == 0, f"{run.stdout[-2000:]}\n{run.stderr[-4000:]}"


def _page_cases() -> list:
    cases = []
    for page in PAGES:
        blocks = [code for language, code, _ in code_blocks(page) if language == "python"]
        marks = [mark for code in blocks for mark in _marks(code)]
        if len(blocks) > 1:
            cases.append(pytest.param(blocks, id=str(page.relative_to(REPO)), marks=marks[:1]))
    return cases


@pytest.mark.parametrize("blocks", _page_cases())
def test_a_page_runs_as_notebook_cells_in_one_kernel_and_folder(blocks, tmp_path):
    # A reader pasting a page's blocks one after another into a notebook: one interpreter, one folder,
    # each block after the last (a block must not clash with what an earlier one left).
    cells = "\n".join(f"exec(compile({code!r}, 'cell {n}', 'exec'))" for n, code in enumerate(blocks, 1))
    run = _run([sys.executable, "-c", cells], tmp_path)
    assert run.returncode == 0, f"{run.stdout[-2000:]}\n{run.stderr[-4000:]}"


def test_every_page_is_in_the_site_and_every_block_is_marked():
    text = "\n".join(page.read_text() for page in PAGES)
    # A fence without a language is neither run nor marked as output: each says which it is.
    fences = re.findall(r"^```(\S*)", text, re.M)
    opening = fences[::2]
    assert all(opening), "a code block without a language"
    assert set(opening) <= {
        "python",
        "bash",
        "text",
        "yaml",
        "{eval-rst}",
        "{toctree}",
        "{daskstream-settings}",
        "{note}",
    }


def test_the_site_builds_without_a_warning(tmp_path):
    pytest.importorskip("sphinx")
    build = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(REPO / "docs"), str(build)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-6000:]
    assert (build / "index.html").is_file()
    # A flag or a quote a reader copies is what they must type: no en dash before an option's name, no
    # curly quotes, anywhere in the built pages.
    for page in build.rglob("*.html"):
        text = page.read_text()
        assert not re.search(r"\u2013[a-z]", text), f"{page.relative_to(build)}: an en dash where -- was written"
        assert not re.search("[\u201c\u201d\u2018\u2019]", text), f"{page.relative_to(build)}: curly quotes"
    for page in (REPO / "docs").rglob("*.md"):
        if "_build" not in page.parts:
            assert (build / page.relative_to(REPO / "docs")).with_suffix(".html").is_file(), page
    shutil.rmtree(build)
