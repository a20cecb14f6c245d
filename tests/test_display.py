"""What Jupyter shows: tables and the storage grid drawn inside the task grid."""

from __future__ import annotations

import re
import subprocess
import sys

import h5py
import numpy as np

import daskstream as ds
from daskstream.display import grid_figure, grid_svg
from daskstream.planning import ChunkPlan
from daskstream.planning.computation import ComputePlan
from daskstream.views import chunk_plan_html


def storage_lines(svg):
    return len(re.findall(r'<line style="stroke:#9aa5b1', svg))


def task_lines(svg):
    """Cuts between tasks (the array's edges are drawn thicker, 2.5)."""
    return len(re.findall(r'<line style="stroke:#1f6fb2;stroke-width:1.5"', svg))


def axis_labels(svg):
    return re.findall(r"<text [^>]*>(\d+)</text>", svg)


def test_grid_draws_storage_lines_inside_task_lines():
    svg = grid_svg((1000, 1000), storage_chunks=(100, 250), task_chunks=(500, 1000))
    assert storage_lines(svg) == 9 + 3  # storage: every 100 rows, every 250 columns
    assert task_lines(svg) == 1  # tasks: one cut at row 500
    assert sorted(axis_labels(svg)) == ["1000", "1000"]


def test_a_grid_too_fine_to_draw_becomes_a_tint():
    svg = grid_svg((100_000, 10), storage_chunks=(10, 10), task_chunks=(50_000, 10))
    assert storage_lines(svg) == 0
    assert "fill:#b9cde3" in svg  # the darker tint
    assert task_lines(svg) == 1
    legend = grid_figure((100_000, 10), (10, 10), (50_000, 10))
    assert "too many to draw" in legend
    assert "axis 0: 100000 in 2 tasks of 50000 (5000 storage chunks each)" in legend


def test_a_3d_array_split_along_its_first_axis_shows_the_split_and_every_length():
    # A daily time series split by time: the cube's two faces along time show the three cuts.
    svg = grid_svg((365, 180, 360), storage_chunks=(30, 90, 180), task_chunks=(120, 180, 360))
    assert task_lines(svg) == 2 * 3
    assert storage_lines(svg) > 0
    assert sorted(axis_labels(svg)) == ["180", "360", "365"]
    legend = grid_figure((365, 180, 360), (30, 90, 180), (120, 180, 360))
    assert "axis 0: 365 in 4 tasks of 120 (4 storage chunks each)" in legend
    assert "axis 2: 360, whole in each task, 2 storage chunks of 180" in legend


def test_arrays_of_more_axes_are_drawn_as_rows_of_pictures_with_every_length():
    svg = grid_svg((8, 64, 64, 3), storage_chunks=(1, 32, 32, 3), task_chunks=(2, 64, 64, 3))
    assert sorted(axis_labels(svg), key=int) == ["3", "8", "64", "64"]  # not dask's extra axis of 1
    assert task_lines(svg) == 3  # the 8 along axis 0 in 4 tasks
    five = grid_svg((4, 5, 6, 7, 8), storage_chunks=None, task_chunks=(2, 5, 6, 7, 4))
    assert sorted(axis_labels(five), key=int) == ["4", "5", "6", "7", "8"]
    assert task_lines(five) > 0


def test_contiguous_arrays_show_the_tasks_and_say_how_they_are_stored(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.zeros((4096, 256), "f4"))
    html = chunk_plan_html(ds.plan(path, memory_budget="64MiB"))
    svg = html[html.index("<svg") : html.index("</svg>")]
    assert task_lines(svg) == ds.plan(path, memory_budget="64MiB").n_tasks - 1 > 0
    assert "stored contiguously; task chunks (blue)" in html
    vector = tmp_path / "v.npy"
    np.save(vector, np.zeros(1000, "f4"))
    assert axis_labels(grid_svg((1000,), storage_chunks=None, task_chunks=(250,))) == ["1000"]


def test_empty_and_0d_arrays_have_no_picture():
    assert grid_svg((), storage_chunks=None, task_chunks=()) == ""
    assert grid_svg((0, 5), storage_chunks=None, task_chunks=(1, 5)) == ""
    assert grid_figure((0, 5), None, (1, 5)) == ""


def test_cards_keep_the_title_apart_from_the_caption_and_the_picture_beside_the_table(tmp_path):
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.zeros((64, 48), "f4"), chunks=(8, 48))
    html = ds.open_source(f"{path}::x")._repr_html_()
    title = re.search(r"<div style='font-weight:bold[^']*'>([^<]*)</div>", html)
    assert title is not None
    assert title.group(1) == "daskstream Source"
    assert f"{path}::/x" in html[title.end() : html.index("<svg")]  # the caption, in its own block
    row = re.search(r"display:flex[^>]*><div><svg.*</svg>.*</div><div><table>", html, re.S)
    assert row is not None  # picture and table side by side


def test_plans_sources_and_descriptions_show_in_jupyter(tmp_path):
    path = tmp_path / "a.h5"
    data = np.arange(64 * 48, dtype="f4").reshape(64, 48)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(8, 48))
    source = ds.open_source(f"{path}::x")
    plan_html = chunk_plan_html(ds.plan(source, memory_budget="64MiB"))
    assert "<svg" in plan_html
    assert "storage chunks (grey)" in plan_html
    assert "<details>" in plan_html
    source_html = source._repr_html_()
    assert "<svg" in source_html
    assert "(8, 48)" in source_html
    described = ds.describe(ds.open(source)).compute()._repr_html_()
    assert "daskstream describe" in described
    assert "<code>" in described


def test_plans_and_tuning_results_are_one_line_at_a_terminal_prompt(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.zeros((4096, 256), "f4"))
    plan = ds.plan(path, memory_budget="64MiB")
    shown = repr(plan)
    assert "\n" not in shown
    assert shown.startswith("<daskstream ChunkPlan chunks=")
    assert f"{plan.n_tasks} task(s)" in shown
    assert "ChunkPlan(" not in shown  # not the dataclass's dump
    result = ds.tune(path, op="sum", time_budget="2s")
    shown = repr(result)
    assert "\n" not in shown
    assert shown.startswith("<daskstream TuneResult sum on ")
    assert "Candidate(" not in shown


def test_plans_carry_their_cards_and_importing_daskstream_changes_no_formatter(tmp_path):
    from IPython.core.interactiveshell import InteractiveShell

    path = tmp_path / "a.npy"
    np.save(path, np.zeros((4096, 256), "f4"))
    chunk_plan = ds.plan(path, memory_budget="64MiB")
    compute_plan = ds.plan_compute(ds.open(path, memory_budget="64MiB").sum(), memory_budget="64MiB")
    # Any frontend that asks the object (marimo, Panel, nbconvert) gets the card, built when asked.
    assert chunk_plan._repr_html_() == chunk_plan_html(chunk_plan)
    assert "daskstream ComputePlan" in compute_plan._repr_html_()
    shell = InteractiveShell.instance()
    try:
        formatter = shell.display_formatter.formatters["text/html"]
        # Nothing of daskstream's is registered with IPython: the objects answer for themselves.
        assert ChunkPlan not in formatter.type_printers
        assert ComputePlan not in formatter.type_printers
        shown, _ = shell.display_formatter.format(chunk_plan)
        assert shown["text/html"] == chunk_plan_html(chunk_plan)
        assert "<svg" in shown["text/html"]
        assert shown["text/plain"] == repr(chunk_plan)  # the one line a terminal shows stays
        shown, _ = shell.display_formatter.format(compute_plan)
        assert "daskstream ComputePlan" in shown["text/html"]
    finally:
        InteractiveShell.clear_instance()


def test_a_kernel_that_imports_daskstream_before_ipython_shows_the_cards(tmp_path):
    code = (
        "import numpy as np, daskstream as ds\n"
        f"np.save({str(tmp_path / 'a.npy')!r}, np.zeros((64, 8), 'f4'))\n"
        f"plan = ds.plan({str(tmp_path / 'a.npy')!r})\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shown, _ = InteractiveShell.instance().display_formatter.format(plan)\n"
        "print('daskstream ChunkPlan' in shown['text/html'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "True"
