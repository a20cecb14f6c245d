"""The README's commands and example are the ones that work."""

from __future__ import annotations

import re

import h5py
import numpy as np


def _code_blocks(text, lang):
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_quick_start_has_two_commands_and_ci_runs_the_second(repo_root):
    readme = (repo_root / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1]
    commands = _code_blocks(quick, "bash")[0].strip().splitlines()
    assert len(commands) == 2
    assert "daskstream demo" in commands[0]
    assert "pytest" in commands[1]
    ci = (repo_root / ".ci" / "run").read_text().strip().splitlines()
    # CI runs it as a user types it, on a line of its own (the check of the lowest versions follows).
    assert commands[1] in ci


def test_usage_example_runs(repo_root, tmp_path, monkeypatch):
    readme = (repo_root / "README.md").read_text()
    example = _code_blocks(readme.split("## Using it", 1)[1], "python")[0]
    monkeypatch.chdir(tmp_path)
    data = np.random.default_rng(1).random((64, 50))
    with h5py.File("scan.h5", "w") as f:
        f.create_dataset("/entry/data", data=data, chunks=(8, 50), compression="gzip")
    scope: dict = {}
    exec(compile(example, "README.md", "exec"), scope)
    np.testing.assert_allclose(scope["x"].mean(axis=0).compute(), data.mean(axis=0))


def test_computing_example_runs(repo_root, tmp_path, monkeypatch):
    import zarr

    readme = (repo_root / "README.md").read_text()
    example = _code_blocks(readme.split("### Computing", 1)[1], "python")[0]
    monkeypatch.chdir(tmp_path)
    data = np.random.default_rng(2).standard_normal((120, 90)).astype("f4")
    field = zarr.create_array("field.zarr", shape=data.shape, chunks=(30, 45), dtype="f4")
    field[...] = data
    scope: dict = {}
    exec(compile(example, "README.md", "exec"), scope)
    np.testing.assert_array_equal(scope["stats"]["count"], data.size)
    # The stencil over chunks equals the stencil over the whole array padded the same way.
    padded = np.pad(data, 1, mode="symmetric")
    want = -4 * data + padded[:-2, 1:-1] + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:]
    np.testing.assert_allclose(scope["curvature"].compute(), want, rtol=1e-5, atol=1e-5)
    stored = zarr.open_array("smooth.zarr", mode="r")[...]
    np.testing.assert_allclose(stored, scope["smooth"].compute())


def test_whole_analyses_example_runs(repo_root, tmp_path, monkeypatch):
    import zarr

    readme = (repo_root / "README.md").read_text()
    computing = _code_blocks(readme.split("### Computing", 1)[1], "python")[0]
    example = _code_blocks(readme.split("### Whole analyses within the memory budget", 1)[1], "python")[0]
    monkeypatch.chdir(tmp_path)
    data = (np.random.default_rng(4).standard_normal((120, 90)) * 2 + 3).astype("f4")
    zarr.create_array("field.zarr", shape=data.shape, chunks=(30, 45), dtype="f4")[...] = data
    scope: dict = {}
    exec(compile(computing, "README.md", "exec"), scope)  # defines laplacian
    exec(compile(example, "README.md", "exec"), scope)
    standardized = zarr.open_array("standardized.zarr", mode="r")[...]
    np.testing.assert_allclose(standardized, (data - data.mean(axis=0)) / data.std(axis=0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(scope["spread"], np.std(data - data.mean()), rtol=1e-5)
    np.testing.assert_allclose(scope["total"], (data / data.max()).sum(), rtol=1e-5)
    assert scope["plan"].passes >= 1
    assert "Passes over the data" in scope["plan"].explain()


def test_tuning_example_runs(repo_root, tmp_path, monkeypatch):
    import dask.config
    import zarr

    readme = (repo_root / "README.md").read_text()
    example = _code_blocks(readme.split("### Tuning chunks on this machine", 1)[1], "python")[0]
    monkeypatch.chdir(tmp_path)
    data = np.random.default_rng(3).standard_normal((4096, 512)).astype("f4")
    for name in ("field.zarr", "other_field.zarr"):
        zarr.create_array(name, shape=data.shape, chunks=(128, 512), dtype="f4")[...] = data
    settings = {
        "daskstream.tune.cache": str(tmp_path / "tune.json"),
        "daskstream.tune.sample-fraction": 4.0,
        "daskstream.tune.cost-fraction": 100.0,
        "daskstream.tune.min-batch-bytes": "256KiB",
        "daskstream.planning.target-chunk-bytes": "512KiB",
    }
    scope: dict = {}
    with dask.config.set(settings):
        exec(compile(example, "README.md", "exec"), scope)
    result = scope["result"]
    assert scope["x"].chunksize == result.chunks
    assert not result.from_cache
    np.testing.assert_array_equal(scope["x"].compute(), data)


def test_streaming_example_runs(repo_root, tmp_path, monkeypatch):
    import zarr

    readme = (repo_root / "README.md").read_text()
    example = _code_blocks(readme.split("### Streaming batches into a training loop", 1)[1], "python")[0]
    example = example.replace("for epoch in range(10):", "for epoch in range(2):")
    monkeypatch.chdir(tmp_path)
    features = np.random.default_rng(4).standard_normal((1000, 8)).astype("f4")
    np.save("features.npy", features)
    zarr.create_array("features.zarr", shape=features.shape, chunks=(100, 8), dtype="f4")[...] = features
    zarr.create_array("labels.zarr", shape=(1000,), chunks=(128,), dtype="i8")[...] = np.arange(1000)
    scope: dict = {"rank": 1, "world": 2}
    exec(compile(example, "README.md", "exec"), scope)
    x, y = scope["x"], scope["y"]
    np.testing.assert_array_equal(x, features[y])


def test_labelled_data_example_runs(repo_root, tmp_path, monkeypatch):
    import pytest

    xr = pytest.importorskip("xarray")
    readme = (repo_root / "README.md").read_text()
    example = _code_blocks(readme.split("### Labelled data and many files", 1)[1], "python")[0]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    rng = np.random.default_rng(3)
    chl = rng.random((6, 10, 12))
    coords = {"time": np.arange(6), "lat": np.linspace(-60, 60, 10), "lon": np.arange(12.0)}
    xr.Dataset({"chl": (("time", "lat", "lon"), chl, {"units": "mg m-3"})}, coords=coords).to_netcdf(
        "ocean.nc", engine="h5netcdf"
    )
    (tmp_path / "runs").mkdir()
    for day in (1, 2, 10):
        with h5py.File(f"runs/day-{day}.h5", "w") as f:
            f["t"] = np.full((4, 3), day, dtype="f4")
        part = xr.Dataset({"v": ("time", np.full(2, day))}, coords={"time": [2 * day, 2 * day + 1]})
        part.to_netcdf(f"runs/day-{day}.nc", engine="h5netcdf")
    scope: dict = {}
    exec(compile(example, "README.md", "exec"), scope)
    np.testing.assert_allclose(scope["mean"].values, chl.mean(axis=0))
    assert scope["mean"].attrs["units"] == "mg m-3"
    np.testing.assert_array_equal(scope["days"].compute()[:, 0], np.repeat([1, 2, 10], 4))


def test_resuming_example_runs(repo_root, tmp_path, monkeypatch):
    import daskstream as ds

    readme = (repo_root / "README.md").read_text()
    example = _code_blocks(readme.split("#### Resuming mid-epoch", 1)[1], "python")[0]
    monkeypatch.chdir(tmp_path)
    np.save("features.npy", np.random.default_rng(5).standard_normal((60_000, 4)).astype("f4"))
    scope: dict = {}
    exec(compile(example, "README.md", "exec"), scope)
    whole = ds.stream("features.npy", batch_size=256, shuffle=True, seed=0)
    whole.set_epoch(3)
    expected = list(whole)[101:]
    assert len(scope["rest"]) == len(expected) > 0
    for got, want in zip(scope["rest"], expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_image_folder_example_runs(repo_root, tmp_path, monkeypatch):
    import pytest

    torch = pytest.importorskip("torch")
    image = pytest.importorskip("PIL.Image")
    readme = (repo_root / "README.md").read_text()
    example = _code_blocks(readme.split("#### Image folders", 1)[1], "python")[0]
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(6)
    for name in ("cat", "dog", "fox"):
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i in range(5):
            pixels = rng.integers(0, 255, (300, 400, 3), dtype=np.uint8)
            image.fromarray(pixels).save(tmp_path / "photos" / name / f"{i}.jpg")
    (tmp_path / "photos" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a JPEG")
    scope: dict = {}
    with pytest.warns(UserWarning, match="broken.jpg"):
        exec(compile(example, "README.md", "exec"), scope)
    photos, dataset = scope["photos"], scope["dataset"]
    assert photos.summary.startswith("15 images in 3 classes, 224x224 RGB, crop, 1 skipped")
    images, labels = next(iter(torch.utils.data.DataLoader(dataset, batch_size=None)))
    assert tuple(images.shape) == (15, 224, 224, 3) or tuple(images.shape[1:]) == (224, 224, 3)
    assert sorted(photos.classes) == ["cat", "dog", "fox"]
    assert set(labels.tolist()) <= {0, 1, 2}


def test_tf_data_example_runs(repo_root, tmp_path, monkeypatch):
    import pytest

    tf = pytest.importorskip("tensorflow")
    import zarr

    readme = (repo_root / "README.md").read_text()
    example = _code_blocks(readme.split("#### TensorFlow (tf.data)", 1)[1], "python")[0]
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(7)
    features = rng.standard_normal((512, 4)).astype("f4")
    zarr.create_array("features.zarr", shape=features.shape, chunks=(64, 4), dtype="f4")[...] = features
    np.save("labels.npy", (features.sum(axis=1) > 0).astype("i8"))
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    scope: dict = {"model": model}
    exec(compile(example.replace("epochs=10", "epochs=2"), "README.md", "exec"), scope)
    assert len(model.history.history["loss"]) == 2
    assert int(scope["data"].cardinality()) == 2
