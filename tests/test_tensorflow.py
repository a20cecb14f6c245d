"""``daskstream.tensorflow.dataset`` with real TensorFlow (CPU): epochs, shares, Keras, and checkpoints restored in a
fresh process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("needs tensorflow", allow_module_level=True)


class _TensorFlow:
    """TensorFlow, imported where a test first uses it: every worker collects this file, and importing
    TensorFlow takes some 6 s, in the one worker that runs it only."""

    def __getattr__(self, name: str):
        import tensorflow

        return getattr(tensorflow, name)


tf = _TensorFlow()

from stream_helpers import WIDTH, N, indexed  # noqa: E402

from daskstream import stream  # noqa: E402 - after the skip without TensorFlow
from daskstream.errors import InvalidArgumentError, MissingDependencyError  # noqa: E402
from daskstream.tensorflow import dataset  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# TensorFlow's C++ start-up and per-op logs, in the subprocesses (run in the repository, importing its
# daskstream); errors still show.
QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def epoch_rows(batches) -> list[int]:
    """The rows of one pass over zipped (features, labels) batches, checking that they match."""
    rows = []
    for x, y in batches:
        assert isinstance(x, tf.Tensor)
        assert isinstance(y, tf.Tensor)
        np.testing.assert_array_equal(x[:, 0].numpy().astype("i8") * 10, y.numpy())
        rows += x[:, 0].numpy().astype("i8").tolist()
    return rows


def test_every_row_once_per_epoch_as_matching_tensors(arrays):
    data = dataset(arrays, batch_size=128, shuffle=True, seed=3)
    for _ in range(2):
        batches = list(data)
        assert len(batches) == int(data.cardinality()) == 24  # ceil(3001 / 128): what Keras shows as steps
        assert sorted(epoch_rows(batches)) == list(range(N))


@pytest.mark.parametrize(
    ("options", "batch_dim"),
    [
        ({}, None),  # the last batch is shorter: the batch dimension is unknown
        ({"drop_last": True}, 128),  # every batch is whole: it is static
    ],
    ids=["last-batch-short", "drop-last"],
)
def test_element_spec_has_each_arrays_shape_and_dtype(arrays, options, batch_dim):
    data = dataset(arrays, batch_size=128, **options)
    assert data.element_spec == (
        tf.TensorSpec((batch_dim, WIDTH), tf.float32),
        tf.TensorSpec((batch_dim,), tf.int64),
    )
    for x, y in data:
        assert x.shape[1:] == (WIDTH,)
        assert y.dtype == tf.int64
        if batch_dim:
            assert x.shape[0] == batch_dim


def test_batches_along_another_axis_keep_the_other_dimensions(tmp_path):
    # Items along axis 1 of a (3, N, 2) array: the spec's unknown dimension is that axis.
    cube = np.stack([indexed(width=2)] * 3)
    np.save(tmp_path / "cube.npy", cube)
    data = dataset(str(tmp_path / "cube.npy"), axis=1, batch_size=500)
    assert data.element_spec == tf.TensorSpec((3, None, 2), tf.float32)
    rows = np.concatenate([batch[0, :, 0].numpy() for batch in data])
    np.testing.assert_array_equal(rows, np.arange(N))


@pytest.mark.parametrize("dtype", [">f8", "<i2", "?"], ids=["big-endian", "int16", "bool"])
def test_values_arrive_as_native_tensors_of_the_arrays_dtype(tmp_path, dtype):
    values = (np.arange(N * 2) % 7).reshape(N, 2).astype(dtype)
    np.save(tmp_path / "a.npy", values)
    data = dataset(str(tmp_path / "a.npy"), batch_size=1000, shuffle=True, seed=2)
    assert data.element_spec.dtype == tf.as_dtype(np.dtype(dtype).newbyteorder("="))
    batches = [batch.numpy() for batch in data]
    ordered = stream(str(tmp_path / "a.npy"), batch_size=1000, shuffle=True, seed=2)
    for got, expected in zip(batches, ordered, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    ("shares", "repeated"),
    [
        ("uneven", 0),  # every row exactly once among the ranks
        ("pad", 1),  # equal shares: the last rank repeats the epoch's first row
    ],
)
def test_two_ranks_take_disjoint_shares_that_cover_every_row(arrays, shares, repeated):
    ranks = [
        dataset(arrays, batch_size=100, shuffle=True, seed=7, rank=rank, world_size=2, shares=shares)
        for rank in range(2)
    ]
    for _ in range(2):
        one, two = (epoch_rows(rank) for rank in ranks)
        assert set(one) | set(two) == set(range(N))
        assert len(one) + len(two) == N + repeated
        assert len(set(one) & set(two)) == repeated
    # Already this rank's share: tf.distribute must not shard it again.
    assert ranks[0].options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF


def test_distribute_datasets_from_function_takes_the_input_contexts_share(arrays):
    def per_pipeline(ctx):
        return dataset(
            arrays[0],
            batch_size=ctx.get_per_replica_batch_size(256),
            shuffle=True,
            seed=0,
            rank=ctx.input_pipeline_id,
            world_size=ctx.num_input_pipelines,
        )

    contexts = [tf.distribute.InputContext(2, pipeline, 2) for pipeline in range(2)]
    shares = [{int(row) for batch in per_pipeline(ctx) for row in batch[:, 0].numpy()} for ctx in contexts]
    assert shares[0] | shares[1] == set(range(N))
    assert len(shares[0] & shares[1]) == 1
    # The same function through a strategy, as a training script calls it.
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    rows = [int(row) for batch in strategy.distribute_datasets_from_function(per_pipeline) for row in batch[:, 0]]
    assert sorted(rows) == list(range(N))


def test_orders_differ_by_epoch_and_repeat_with_the_seed(arrays):
    def three_epochs(data) -> list[list[int]]:
        return [epoch_rows(data) for _ in range(3)]

    first = three_epochs(dataset(arrays, batch_size=64, shuffle=True, seed=11))
    assert first[0] != first[1] != first[2] != first[0]
    assert three_epochs(dataset(arrays, batch_size=64, shuffle=True, seed=11)) == first
    # epoch= starts later in the same sequence (a resumed Keras run); repeat() runs the epochs on.
    assert epoch_rows(dataset(arrays, batch_size=64, shuffle=True, seed=11, epoch=2)) == first[2]
    repeated = dataset(arrays, batch_size=64, shuffle=True, seed=11).repeat(3)
    assert epoch_rows(repeated) == first[0] + first[1] + first[2]


def test_keras_fit_trains_two_epochs_of_the_streams_batches(tmp_path):
    keras = pytest.importorskip("keras")
    features = indexed(n=1000)
    features[:, 0] /= 1000  # the index, scaled to train on
    np.save(tmp_path / "x.npy", features)
    np.save(tmp_path / "y.npy", features[:, 1:2] * 2)
    paths = (str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    data = dataset(paths, batch_size=100, shuffle=True, seed=5)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    # shuffle=False: the order is daskstream's (Keras warns that it ignores its own for a tf.data dataset).
    history = model.fit(data, epochs=2, shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert len(losses) == 2
    assert np.isfinite(losses).all()
    assert losses[1] < losses[0]

    # Keras made one pass per epoch: the next is epoch 2, as in a fresh dataset's third pass.
    def rows(batches):
        return [np.rint(x[:, 0].numpy() * 1000).astype(int).tolist() for x, _ in batches]

    fresh = dataset(paths, batch_size=100, shuffle=True, seed=5, epoch=2)
    assert rows(data) == rows(fresh)


RESTORE = """
import json, sys
import tensorflow as tf
from daskstream.tensorflow import dataset

paths, folders, count = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
out = {}
for name, folder in folders.items():
    data = dataset(tuple(paths), batch_size=128, shuffle=True)  # no seed: the checkpoint carries the one drawn
    iterator = iter(data.repeat())
    tf.train.Checkpoint(data=iterator).restore(tf.train.latest_checkpoint(folder)).assert_consumed()
    out[name] = [next(iterator)[0][:, 0].numpy().astype(int).tolist() for _ in range(count)]
print(json.dumps(out))
# The iterators stay alive: the interpreter exits while tf.data's threads still call into Python.
"""


def test_a_checkpoint_restored_in_a_fresh_process_yields_the_batches_an_uninterrupted_run_would(arrays, tmp_path):
    # Saved mid-epoch, and after the epoch's last batch but before its end: the restored iterators go on
    # into the next epoch, with the order of the seed drawn here.
    per_epoch, count, folders, expected = 24, 30, {}, {}
    for name, taken in {"mid-epoch": 10, "epoch-end": per_epoch}.items():
        data = dataset(arrays, batch_size=128, shuffle=True)
        iterator = iter(data.repeat())
        for _ in range(taken):
            next(iterator)
        folder = tmp_path / name
        path = tf.train.Checkpoint(data=iterator).save(str(folder / "ckpt"))
        # Positions and the stream's state (about 2 KiB) only: less than one prefetched batch would take.
        assert os.path.getsize(f"{path}.data-00000-of-00001") < 128 * (WIDTH * 4 + 8)
        folders[name] = str(folder)
        expected[name] = [next(iterator)[0][:, 0].numpy().astype(int).tolist() for _ in range(count)]
        del iterator
    done = subprocess.run(
        [sys.executable, "-c", RESTORE, json.dumps(arrays), json.dumps(folders), str(count)],
        capture_output=True, text=True, timeout=240, env=QUIET, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # 30 batches: the rest of epoch 0 (14 mid-epoch, none at its end), then epoch 1's (and 2's).
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected


def test_a_restore_into_a_dataset_of_other_data_is_refused(arrays, tmp_path):
    data = dataset(arrays, batch_size=128, shuffle=True, seed=1)
    iterator = iter(data)
    next(iterator)
    path = tf.train.Checkpoint(data=iterator).save(str(tmp_path / "ckpt"))
    np.save(arrays[0], indexed() + 1)  # the features rewritten since
    other = iter(dataset(arrays, batch_size=128, shuffle=True, seed=1))
    tf.train.Checkpoint(data=other).restore(path)
    with pytest.raises(tf.errors.OpError, match="SourceChangedError: the saved stream state is of other data"):
        next(other)


@pytest.mark.parametrize(
    ("x", "options", "message"),
    [
        ([1, 2, 3], {}, "stream takes paths, Sources, dask arrays"),  # a list is not an array to stream
        (np.array(["a", "b"]), {}, "holds <U1, which TensorFlow has no tensor of"),
        (np.arange(4.0), {"num_workers": 2}, "num_workers= splits a rank among PyTorch DataLoader workers"),
        (np.arange(4.0), {"epoch": -1}, "epoch=-1 must be an int of at least 0"),
    ],
    ids=["not-an-array", "strings", "loader-workers", "negative-epoch"],
)
def test_errors_say_what_to_do(x, options, message):
    with pytest.raises(InvalidArgumentError, match=message):
        dataset(x, **options)


def test_the_stream_behind_is_the_one_ds_stream_makes(arrays):
    # One source of batches: the dataset yields exactly ds.stream's, in its order.
    direct = [x[:, 0].astype(int).tolist() for x, _ in stream(arrays, batch_size=256, shuffle=True, seed=9)]
    through = [x[:, 0].numpy().astype(int).tolist() for x, _ in dataset(arrays, batch_size=256, shuffle=True, seed=9)]
    assert through == direct


WITHOUT_TENSORFLOW = """
import sys
import daskstream
assert "tensorflow" not in sys.modules, "import daskstream imported TensorFlow"
sys.modules["tensorflow"] = None  # as where TensorFlow is not installed: importing it fails
try:
    import daskstream.tensorflow
except ImportError as exc:
    print(type(exc).__name__, exc)
"""


def test_tensorflow_is_imported_only_by_daskstream_tensorflow():
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WITHOUT_TENSORFLOW)],
        capture_output=True, text=True, timeout=120, env=QUIET, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(MissingDependencyError.__name__)
    assert "pip install 'daskstream[tensorflow]'" in done.stdout
    # The module's own name does not shadow TensorFlow inside it.
    import tensorflow

    import daskstream.tensorflow as adapter

    assert adapter.tf is tensorflow
