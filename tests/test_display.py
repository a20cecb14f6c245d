"""What Jupyter shows: tables and the storage grid drawn inside the task grid."""

from __future__ import annotations

import re

import h5py
import numpy as np

import daskstream as ds
from daskstream.display import grid_svg


def lines(svg, colour):
    return len(re.findall(rf'<line [^>]*stroke="{colour}"', svg))


def test_grid_draws_storage_lines_inside_task_lines():
    svg = grid_svg((1000, 1000), storage_chunks=(100, 250), task_chunks=(500, 1000))
    assert lines(svg, "#9aa5b1") == 9 + 3  # storage: every 100 rows, every 250 columns
    assert lines(svg, "#1f6fb2") == 1  # tasks: one cut at row 500


def test_a_grid_too_fine_to_draw_becomes_a_tint():
    svg = grid_svg((100_000, 10), storage_chunks=(10, 10), task_chunks=(50_000, 10))
    assert lines(svg, "#9aa5b1") == 0
    assert 'opacity="0.25"' in svg
    assert lines(svg, "#1f6fb2") == 1


def test_plans_sources_and_descriptions_show_in_jupyter(tmp_path):
    path = tmp_path / "a.h5"
    data = np.arange(64 * 48, dtype="f4").reshape(64, 48)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(8, 48))
    source = ds.open_source(f"{path}::x")
    plan_html = ds.plan(source, memory_budget="64MiB")._repr_html_()
    assert "<svg" in plan_html
    assert "storage chunks (grey)" in plan_html
    assert "<details>" in plan_html
    source_html = source._repr_html_()
    assert "<svg" in source_html
    assert "(8, 48)" in source_html
    described = ds.describe(ds.open(source)).compute()._repr_html_()
    assert "daskstream describe" in described
    assert "<code>" in described
