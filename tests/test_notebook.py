"""The example notebooks run top to bottom in a real Jupyter kernel, as saved."""

from __future__ import annotations

import json
from importlib import util

import nbformat
import pytest
from nbclient import NotebookClient


def builder(repo_root):
    spec = util.spec_from_file_location("build_notebooks", repo_root / "examples" / "build_notebooks.py")
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_saved(repo_root, tmp_path, name):
    """The saved notebook ``name``, checked to be the one the builder makes (with outputs), run again."""
    notebook = nbformat.read(repo_root / "examples" / f"{name}.ipynb", as_version=4)
    assert [c.source for c in notebook.cells] == [text for _, text in builder(repo_root).NOTEBOOKS[name]]
    assert all(c.outputs for c in notebook.cells if c.cell_type == "code" and "shutil" not in c.source)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    return notebook


def outputs_of(notebook, first_line: str) -> list:
    return next(c.outputs for c in notebook.cells if c.cell_type == "code" and c.source.startswith(first_line))


def test_quickstart_notebook_runs_without_error(repo_root, tmp_path):
    notebook = run_saved(repo_root, tmp_path, "quickstart")
    outputs = {c.source.splitlines()[0]: c.outputs for c in notebook.cells if c.cell_type == "code"}
    shown = json.dumps(outputs)
    for rich in ("daskstream Source", "daskstream ChunkPlan", "daskstream describe", "daskstream TuneResult"):
        assert rich in shown, rich
    assert "<svg" in shown
    assert outputs_of(notebook, "seen, total")[0]["data"]["text/plain"] == "(True, True)"


def test_labelled_notebook_runs_and_shows_labels(repo_root, tmp_path):
    pytest.importorskip("xarray")
    notebook = run_saved(repo_root, tmp_path, "labelled")
    listed = outputs_of(notebook, "ds.list")[0]["data"]["text/plain"]
    assert "sst  int16 (24, 61, 180)  chunks (6, 61, 180)" in listed
    dataset_view = outputs_of(notebook, "sea = ds.open_dataset")[0]["data"]
    assert "xr-wrap" in dataset_view["text/html"]  # xarray's own rich view
    assert "degC" in dataset_view["text/html"]
    mean_view = outputs_of(notebook, "mean_sst = ")[0]["data"]["text/plain"]
    assert "<xarray.DataArray 'sst' (lat: 61, lon: 180)>" in mean_view
    quantiles = outputs_of(notebook, 'ds.reduce(sea.wind, "quantile"')[0]["data"]["text/plain"]
    assert "(quantile: 3, time: 24)" in quantiles
    week = outputs_of(notebook, "week = ")[0]["data"]["text/plain"]
    assert "(time: 72, lat: 61, lon: 180)" in week
    assert outputs_of(notebook, "theirs = ")[0]["data"]["text/plain"] == "(True, True)"
