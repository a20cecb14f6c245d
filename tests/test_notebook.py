"""examples/quickstart.ipynb runs top to bottom in a real Jupyter kernel, as saved."""

from __future__ import annotations

import json

import nbformat
from nbclient import NotebookClient


def test_quickstart_notebook_runs_without_error(repo_root, tmp_path):
    path = repo_root / "examples" / "quickstart.ipynb"
    notebook = nbformat.read(path, as_version=4)
    # The saved notebook is the one the builder makes, with its outputs.
    from importlib import util

    spec = util.spec_from_file_location("build_quickstart", repo_root / "examples" / "build_quickstart.py")
    builder = util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    assert [c.source for c in notebook.cells] == [text for _, text in builder.CELLS]
    assert all(c.outputs for c in notebook.cells if c.cell_type == "code" and "shutil" not in c.source)

    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = {c.source.splitlines()[0]: c.outputs for c in notebook.cells if c.cell_type == "code"}
    shown = json.dumps(outputs)
    for rich in ("daskstream Source", "daskstream ChunkPlan", "daskstream describe", "daskstream TuneResult"):
        assert rich in shown, rich
    assert "<svg" in shown
    last_check = next(
        o for c in notebook.cells if c.cell_type == "code" and c.source.startswith("seen, total") for o in c.outputs
    )
    assert last_check["data"]["text/plain"] == "(True, True)"
