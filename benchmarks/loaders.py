"""Training-loop loaders side by side: daskstream against the loaders people write or convert their data for.

Every contender yields batches of ``--batch`` rows (``--image-batch`` images)
for an epoch, shuffled and in order, with the same number of loader workers
(``--workers``), over the same data:

* **arrays**: the float32 field of :mod:`benchmarks.samples` (4 KiB rows) as
  ``.npy``, HDF5 (gzip 1 + shuffle) and Zarr v3 (zstd 3), read where it lies;
  and, for the loaders that need their own format, copies of it converted
  once (``webdataset`` tar shards, LitData chunks, TFRecord files; one record
  per row in each);
* **a JPEG folder** of ``--images`` photo-like JPEGs
  (:func:`benchmarks.images.photo`, ``--photo`` pixels, quality 90) decoded
  and resized to ``--target``; and its webdataset tar copy.

Contenders on arrays (PyTorch ones through ``torch.utils.data.DataLoader``
with ``num_workers=W`` and persistent workers):

* **StreamDataset**: ``DataLoader(StreamDataset(source, batch_size=B, shuffle=s),
  batch_size=None, num_workers=W)``, the documented setup; and
  **StreamDataset num_workers=0** (the stream read in the training process, its
  own reading threads);
* **daskstream.tensorflow**: ``daskstream.tensorflow.dataset(path, batch_size=B, shuffle=s)``;
* **BatchSampler loader**: a map-style dataset whose ``__getitem__`` takes a
  list of row indices and reads them (sorted) at once -- a memory map for
  ``.npy``, h5py fancy indexing for HDF5, ``zarr``'s ``oindex`` for Zarr --
  with ``sampler=BatchSampler(RandomSampler or SequentialSampler, B)``;
* **row Dataset**: the textbook map-style dataset, one row per ``__getitem__``,
  ``DataLoader(batch_size=B, shuffle=s, collate_fn=torch.stack)``;
* **tf.data from_generator**: ``Dataset.from_generator`` over a Python
  generator doing the BatchSampler loader's reads (a new permutation each
  epoch, or contiguous slices in order), ``.prefetch(AUTOTUNE)``;
* **webdataset** (converted copy): tar shards of one ``.npy`` member per row,
  ``WebDataset(shards, shardshuffle=...).shuffle(--buffer).decode().to_tuple("npy").batched(B)``
  through the DataLoader; in order without either shuffle;
* **LitData** (converted copy): ``litdata.optimize`` once, one row per item,
  then ``StreamingDataLoader(StreamingDataset(dir, shuffle=s), batch_size=B, num_workers=W)``;
* **TFRecord** (converted copy): one ``tf.train.Example`` per row (the row's
  bytes), ``TFRecordDataset`` (file order shuffled and ``W`` files read at
  once when shuffling) ``.shuffle(--buffer).batch(B).map(parse_example +
  decode_raw, AUTOTUNE).prefetch(AUTOTUNE)``.

On the JPEG folder: **StreamDataset** (and with 0 workers) over
``ds.open_images(folder, size=target, labels=None).images``; **tf.data**
(``list_files(shuffle=s)`` -> ``map(read_file + decode_jpeg + resize,
num_parallel_calls=AUTOTUNE)`` -> ``batch`` -> ``prefetch(AUTOTUNE)``; its
default resize is bilinear without antialiasing, cheaper than Pillow's and
aliased when it shrinks: **tf.data antialias** is the same with
``antialias=True``);
**Pillow DataLoader** (a map-style dataset: ``Image.open``, ``draft``,
``convert("RGB")``, bilinear ``resize``); **webdataset** (tar shards of the JPEG
bytes, decoded by the same Pillow function).

Shuffles differ, and the table says how each contender shuffles: the
hand-written loaders, ``from_generator`` and tf.data's ``list_files`` draw a
full permutation; webdataset and TFRecord fill a buffer of ``--buffer``
samples and draw from it (after shuffling the shard order), which is weaker
than a full permutation: a row leaves the buffer within about a buffer's
length of where it lies; daskstream permutes its shards and mixes the rows of
each window of ``shuffle_blocks`` shards; LitData permutes its chunks and,
within each, blocks of 256 items and the items of each block.

How it is timed: each round, every (layout, contender) runs in a fresh
interpreter (imports not timed), which does both orders, one after the other
(shuffled first in odd rounds, in order first in even ones). For each order it
builds its loader (timed apart, as "setup"), runs an untimed epoch (persistent
workers started, tf.data's tracing; stopped after 1 s), then a timed one.
Every epoch is stopped after ``--epoch-seconds`` and timed over the rows it
delivered by then (hand-written loaders on compressed files decode a chunk
for every few rows and would take hours; the table marks those epochs
"stopped"). Medians of ``--repeats`` rounds. The copies' contenders read the
same bytes whatever the layout, so they run once per round and are shown
with every array layout. Before the rounds every file is read once (warm
page cache).

With a training step: in shuffled order the native array contenders also
run an epoch with a step as long as StreamDataset's time per batch (from a
calibration run first) simulated by sleeping; the figure is the share of the
epoch the loop spent waiting for batches (target: at most 5% for StreamDataset).

Conversions (written once into ``benchmarks/data/``, beside the sample files,
each in a fresh interpreter, reused by later runs, their time reported apart
and never counted in an epoch): tar, LitData and TFRecord copies of the
``.npy``, and a tar copy of the JPEG folder, in shards of ``--shard`` bytes
at most and of an eighth of the data at most, so that every worker gets
several.

    python -m benchmarks.loaders [--size 128MiB] [--only npy,hdf5-gzip,zarr-zstd,jpeg] [--workers 2]
                                 [--batch 256] [--images 1000] [--repeats 3] [--out benchmarks/results/loaders]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from dask.utils import format_bytes, parse_bytes

REPOSITORY = Path(__file__).resolve().parent.parent
IMAGES = "jpeg"
# The table of the loaders that read converted copies: the same rows whatever the layout they are shown with.
COPIES = "copies"
ORDERS = ("shuffled", "in order")
# Quiet TensorFlow's start-up lines; LitData never asks PyPI for a newer version in a timed run.
CHILD_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "LITDATA_DISABLE_VERSION_CHECK": "1", "PYTHONWARNINGS": "ignore"}
# What a child prints before its result, so that library output on stdout cannot be mistaken for it.
RESULT = "loaders-result:"
# Said under the summary: the shuffles compared are not alike.
SHUFFLES = (
    "The shuffles are not alike (each table's shuffle column): webdataset's and TFRecord's are buffer shuffles, "
    "weaker than a full permutation (a row leaves the buffer within about a buffer's length of where it lies); "
    "daskstream's mixes the rows of windows of shards taken in a random order; LitData's permutes chunks, then "
    "blocks of 256 rows within each; the hand-written loaders, from_generator and tf.data's list_files draw a "
    "full permutation."
)
# The untimed epoch before the timed one is stopped after this long.
WARM_SECONDS = 1.0


# -- reading the arrays by hand (the hand-written contenders) ---------------------------


def _open(where: str) -> Any:
    """The array at ``where`` (``path`` or ``path::member``): a memory map, an h5py dataset or a zarr array."""
    path, _, member = where.partition("::")
    if path.endswith(".npy"):
        return np.load(path, mmap_mode="r")
    if path.endswith(".h5"):
        import h5py

        return h5py.File(path, "r")[member]
    import zarr

    return zarr.open_group(path, mode="r")[member]


def _read_rows(array: Any, indices: Any) -> np.ndarray:
    """Rows ``indices`` of ``array``, sorted first: the order memory maps, h5py and zarr read best."""
    chosen = np.sort(np.asarray(indices))
    rows = array.oindex[chosen] if hasattr(array, "oindex") else array[chosen]
    return np.ascontiguousarray(rows)


class RowsByIndices:
    """``dataset[indices]`` reads the rows at once (the BatchSampler loader)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.array: Any = None
        self.length = _open(where).shape[0]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, indices: list[int]) -> Any:
        import torch

        if self.array is None:  # opened in each worker, after the fork
            self.array = _open(self.where)
        return torch.from_numpy(_read_rows(self.array, indices))


class Rows(RowsByIndices):
    """``dataset[i]`` reads one row (the textbook map-style dataset)."""

    def __getitem__(self, index: int) -> Any:  # type: ignore[override]
        import torch

        if self.array is None:
            self.array = _open(self.where)
        return torch.from_numpy(np.array(self.array[index]))


# -- images by hand ------------------------------------------------------------------------


def pillow_decode(source: Any, size: tuple[int, int]) -> np.ndarray:
    """A JPEG (path or file object) as a ``size`` (height, width) RGB uint8 array, as a careful Pillow user writes it:
    ``draft`` has libjpeg decode at 1/2, 1/4 or 1/8 scale where that still covers ``size``, then a bilinear resize
    (antialiased when it shrinks, as daskstream's)."""
    from PIL import Image

    height, width = size
    with Image.open(source) as image:
        image.draft("RGB", (width, height))
        return np.asarray(image.convert("RGB").resize((width, height), Image.Resampling.BILINEAR))


class PillowImages:
    """A map-style dataset: ``dataset[i]`` is file ``i`` decoded by :func:`pillow_decode`, as a tensor."""

    def __init__(self, files: list[str], size: tuple[int, int]) -> None:
        self.files, self.size = files, size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> Any:
        import torch

        return torch.from_numpy(pillow_decode(self.files[index], self.size))


def _jpeg_files(folder: str) -> list[str]:
    return sorted(os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".jpg"))


def _decode_jpeg_sample(size: tuple[int, int], sample: dict[str, Any]) -> tuple[np.ndarray]:
    return (pillow_decode(io.BytesIO(sample["jpg"]), size),)


# -- the contenders, built in the child ----------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One contender's run: what the child builds and how long it may take.

    Attributes
    ----------
    loader
        The contender's name (a key of :data:`CONTENDERS`).
    where
        What it reads: an array's ``path[::member]``, the JPEG folder, or a converted copy's directory.
    shuffled
        Shuffled, or in order.
    batch, workers
        Rows (images) a batch; loader workers (tf.data: threads of its private pool).
    limit
        Seconds after which an epoch is stopped.
    step
        Seconds of simulated training step per batch in the stepped epoch (0: none).
    buffer
        The shuffle buffer of webdataset and TFRecord, in samples.
    size
        ``(height, width)`` the images are resized to.
    """

    loader: str
    where: str
    shuffled: bool
    batch: int
    workers: int
    limit: float
    step: float = 0.0
    buffer: int = 0
    size: tuple[int, int] = (224, 224)


def _data_loader(dataset: Any, run: Run, workers: int | None = None, **options: Any) -> Any:
    from torch.utils.data import DataLoader

    workers = run.workers if workers is None else workers
    return DataLoader(dataset, num_workers=workers, persistent_workers=workers > 0, **options)


def _stream_dataset(run: Run, workers: int | None = None, images: bool = False) -> Any:
    import daskstream as ds
    from daskstream.torch import StreamDataset

    source = ds.open_images(run.where, size=run.size, labels=None).images if images else ds.open_source(run.where)
    dataset = StreamDataset(source, batch_size=run.batch, shuffle=run.shuffled)
    return _data_loader(dataset, run, workers, batch_size=None)


def _daskstream_tensorflow(run: Run) -> Any:
    from daskstream.tensorflow import dataset

    return dataset(run.where, batch_size=run.batch, shuffle=run.shuffled)


def _batch_sampler(run: Run) -> Any:
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    dataset = RowsByIndices(run.where)
    order = RandomSampler(range(len(dataset))) if run.shuffled else SequentialSampler(range(len(dataset)))
    return _data_loader(dataset, run, sampler=BatchSampler(order, run.batch, drop_last=False), batch_size=None)


def _row_dataset(run: Run) -> Any:
    import torch

    return _data_loader(Rows(run.where), run, batch_size=run.batch, shuffle=run.shuffled, collate_fn=torch.stack)


def _tf_options(run: Run) -> Any:
    """tf.data's options with ``run.workers`` threads in its pool: the same parallelism as the DataLoaders."""
    import tensorflow as tf

    options = tf.data.Options()
    if run.workers > 0:
        options.threading.private_threadpool_size = run.workers
    return options


def _tf_from_generator(run: Run) -> Any:
    import tensorflow as tf

    array = _open(run.where)
    rows, columns = array.shape

    def batches() -> Iterable[np.ndarray]:
        # Called again for each pass: a new permutation each epoch, as RandomSampler draws.
        order = np.random.default_rng().permutation(rows) if run.shuffled else None
        for start in range(0, rows, run.batch):
            if order is None:
                yield np.ascontiguousarray(array[start : start + run.batch])
            else:
                yield _read_rows(array, order[start : start + run.batch])

    spec = tf.TensorSpec((None, columns), tf.float32)
    data = tf.data.Dataset.from_generator(batches, output_signature=spec).prefetch(tf.data.AUTOTUNE)
    return data.with_options(_tf_options(run))


def _webdataset_arrays(run: Run) -> Any:
    import webdataset as wds

    shards = sorted(str(p) for p in Path(run.where).glob("*.tar"))
    data = wds.WebDataset(shards, shardshuffle=len(shards) if run.shuffled else False, empty_check=False)
    if run.shuffled:
        data = data.shuffle(run.buffer)
    data = data.decode().to_tuple("npy").batched(run.batch)
    return _data_loader(data, run, batch_size=None)


def _litdata(run: Run) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset

    dataset = StreamingDataset(run.where, shuffle=run.shuffled)
    return StreamingDataLoader(
        dataset, batch_size=run.batch, num_workers=run.workers, persistent_workers=run.workers > 0
    )


def _tfrecord(run: Run) -> Any:
    import tensorflow as tf

    files = sorted(str(p) for p in Path(run.where).glob("*.tfrecord"))
    features = {"x": tf.io.FixedLenFeature([], tf.string)}

    def parse(records: Any) -> Any:
        # A whole batch at once: tf.data's guide's "vectorized map".
        return tf.io.decode_raw(tf.io.parse_example(records, features)["x"], tf.float32)

    if run.shuffled:
        names = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files))
        cycle = max(1, run.workers)
        data = names.interleave(tf.data.TFRecordDataset, cycle_length=cycle, num_parallel_calls=cycle)
        data = data.shuffle(run.buffer)
    else:
        data = tf.data.TFRecordDataset(files)
    data = data.batch(run.batch).map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    return data.with_options(_tf_options(run))


def _tf_images(run: Run, antialias: bool = False) -> Any:
    import tensorflow as tf

    def load(path: Any) -> Any:
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        return tf.cast(tf.image.resize(image, run.size, antialias=antialias), tf.uint8)

    # list_files shuffles the names themselves (a full permutation each epoch); in order, sorted.
    names = tf.data.Dataset.list_files(os.path.join(run.where, "*.jpg"), shuffle=run.shuffled)
    data = names.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(run.batch).prefetch(tf.data.AUTOTUNE)
    return data.with_options(_tf_options(run))


def _pillow_loader(run: Run) -> Any:
    return _data_loader(PillowImages(_jpeg_files(run.where), run.size), run, batch_size=run.batch, shuffle=run.shuffled)


def _webdataset_images(run: Run) -> Any:
    import webdataset as wds

    shards = sorted(str(p) for p in Path(run.where).glob("*.tar"))
    data = wds.WebDataset(shards, shardshuffle=len(shards) if run.shuffled else False, empty_check=False)
    if run.shuffled:
        data = data.shuffle(run.buffer)
    data = data.map(functools.partial(_decode_jpeg_sample, run.size)).batched(run.batch)
    return _data_loader(data, run, batch_size=None)


@dataclass(frozen=True)
class Contender:
    """A loader the benchmark runs.

    Attributes
    ----------
    name
        How tables name it.
    kind
        ``"arrays"`` or ``"images"``: the data it runs on.
    build
        Makes the loader of a :class:`Run` (in the child, after its imports).
    imports
        Modules imported before the timer starts.
    copy
        The converted copy it reads (``"tar"``, ``"litdata"``, ``"tfrecord"``), ``None`` for the data itself.
    daskstream
        Whether it is daskstream's (the others are what it is compared with).
    shuffle
        How it shuffles, for the table (``{buffer}`` and ``{window}`` filled in).
    stepped
        Whether it also runs the epoch with a training step (shuffled order).
    """

    name: str
    kind: str
    build: Callable[[Run], Any]
    imports: tuple[str, ...]
    copy: str | None = None
    daskstream: bool = False
    shuffle: str = "full permutation"
    stepped: bool = False


def _key(kind: str, name: str) -> str:
    return f"{kind}:{name}"


_TORCH = ("torch", "daskstream", "daskstream.torch")
_WINDOW = "shard order permuted, then rows mixed within windows of {window}"
CONTENDERS = {
    _key(c.kind, c.name): c
    for c in (
        Contender("StreamDataset", "arrays", _stream_dataset, _TORCH, daskstream=True, shuffle=_WINDOW, stepped=True),
        Contender(
            "StreamDataset num_workers=0",
            "arrays",
            functools.partial(_stream_dataset, workers=0),
            _TORCH,
            daskstream=True,
            shuffle=_WINDOW,
            stepped=True,
        ),
        Contender(
            "daskstream.tensorflow",
            "arrays",
            _daskstream_tensorflow,
            ("tensorflow", "daskstream.tensorflow"),
            daskstream=True,
            shuffle=_WINDOW,
            stepped=True,
        ),
        Contender("BatchSampler loader", "arrays", _batch_sampler, ("torch", "h5py", "zarr"), stepped=True),
        Contender("row Dataset", "arrays", _row_dataset, ("torch", "h5py", "zarr"), stepped=True),
        Contender("tf.data from_generator", "arrays", _tf_from_generator, ("tensorflow", "h5py", "zarr"), stepped=True),
        Contender(
            "webdataset",
            "arrays",
            _webdataset_arrays,
            ("torch", "webdataset"),
            copy="tar",
            shuffle="shard order permuted + a buffer of {buffer} samples",
        ),
        Contender(
            "LitData",
            "arrays",
            _litdata,
            ("torch", "litdata"),
            copy="litdata",
            shuffle="chunk order permuted, then blocks of 256 rows within a chunk, rows within a block",
        ),
        Contender(
            "TFRecord",
            "arrays",
            _tfrecord,
            ("tensorflow",),
            copy="tfrecord",
            shuffle="file order permuted + a buffer of {buffer} records",
        ),
        Contender(
            "StreamDataset",
            "images",
            functools.partial(_stream_dataset, images=True),
            _TORCH,
            daskstream=True,
            shuffle=_WINDOW,
        ),
        Contender(
            "StreamDataset num_workers=0",
            "images",
            functools.partial(_stream_dataset, workers=0, images=True),
            _TORCH,
            daskstream=True,
            shuffle=_WINDOW,
        ),
        Contender("tf.data", "images", _tf_images, ("tensorflow",), shuffle="full permutation (of the file names)"),
        # The same with the antialiased resize that Pillow's (and so daskstream's and the Pillow loader's) is.
        Contender(
            "tf.data antialias",
            "images",
            functools.partial(_tf_images, antialias=True),
            ("tensorflow",),
            shuffle="full permutation (of the file names)",
        ),
        Contender("Pillow DataLoader", "images", _pillow_loader, ("torch", "PIL.Image")),
        Contender(
            "webdataset",
            "images",
            _webdataset_images,
            ("torch", "webdataset", "PIL.Image"),
            copy="tar",
            shuffle="shard order permuted + a buffer of {buffer} samples",
        ),
    )
}
ARRAY_CONTENDERS = tuple(c.name for c in CONTENDERS.values() if c.kind == "arrays")
IMAGE_CONTENDERS = tuple(c.name for c in CONTENDERS.values() if c.kind == "images")
# What benchmarks.stream runs: the PyTorch loaders, shuffled.
ORIGINAL = ("StreamDataset", "BatchSampler loader", "row Dataset")


def _rows(batch: Any) -> int:
    """Rows of a batch: a tensor or array, or (webdataset's ``to_tuple``) a one-element list of one."""
    if isinstance(batch, (list, tuple)):
        batch = batch[0]
    return int(batch.shape[0])


def epoch(loader: Any, step: float, limit: float | None = None) -> tuple[int, float, float]:
    """Rows, seconds and seconds spent waiting for batches in one epoch (stopped after ``limit`` s)."""
    rows, waited = 0, 0.0
    start = time.perf_counter()
    iterator = iter(loader)
    while True:
        asked = time.perf_counter()
        batch = next(iterator, None)
        waited += time.perf_counter() - asked
        if batch is None:
            break
        rows += _rows(batch)
        if step:
            time.sleep(step)
        if limit is not None and time.perf_counter() - start > limit:
            break
    del iterator
    return rows, time.perf_counter() - start, waited


def child(kind: str, runs: list[Run]) -> list[dict[str, Any]]:
    """One contender's runs (one per order) in this fresh interpreter: for each, the loader is built (timed apart),
    an untimed epoch warms it (workers started, tf.data traced), then an epoch is timed, and one with a step."""
    contender = CONTENDERS[_key(kind, runs[0].loader)]
    for module in contender.imports:
        __import__(module)
    results = []
    for run in runs:
        start = time.perf_counter()
        loader = contender.build(run)
        setup = time.perf_counter() - start
        # At most WARM_SECONDS: what warms is the start; a slow loader's rate is steady by then.
        epoch(loader, 0.0, min(run.limit, WARM_SECONDS))
        rows, seconds, waited = epoch(loader, 0.0, run.limit)
        result: dict[str, Any] = {"setup_seconds": setup, "rows": rows, "seconds": seconds, "waited_seconds": waited}
        if run.step:
            rows, seconds, waited = epoch(loader, run.step, run.limit)
            result["stepped"] = {"rows": rows, "seconds": seconds, "waited_seconds": waited}
        results.append(result)
        del loader  # its workers end before the next order's start
    return results


class ChildFailed(Exception):
    """A child interpreter gave no result: its last line of errors, or why."""


def in_child(arguments: list[str], timeout: float | None = None, module: str = "benchmarks.loaders") -> Any:
    """The result ``python -m MODULE ARGUMENTS`` prints (after :data:`RESULT`), from a fresh interpreter in the
    repository."""
    command = [sys.executable, "-m", module, *arguments]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, cwd=REPOSITORY, env={**os.environ, **CHILD_ENV}, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"no result within {timeout:.0f} s") from None
    found = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or not found:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise ChildFailed(lines[-1] if lines else f"exit status {done.returncode}")
    return json.loads(found[-1][len(RESULT) :])


def spawn(kind: str, runs: list[Run]) -> list[dict[str, Any]]:
    """:func:`child` in a fresh interpreter: a result per run, ``{"error": ...}`` for each when it failed."""
    start = time.perf_counter()
    try:
        results = in_child(
            ["--child", kind, json.dumps([r.__dict__ for r in runs])], 90 + sum(10 * r.limit for r in runs)
        )
    except ChildFailed as failed:
        return [{"error": str(failed)}] * len(runs)
    # The whole child's time, start-up and warming included (not a figure: what a run of the benchmark costs).
    return [{**result, "child_seconds": time.perf_counter() - start} for result in results]


# -- the data: sample files, photos and converted copies ---------------------------------


def shard_bytes(total: int, most: int) -> int:
    """Bytes of a converted copy's shard: ``most``, or an eighth of the data when smaller, so that every loader
    worker gets several shards (webdataset hands each worker whole shards)."""
    return int(max(1 << 20, min(most, total // 8)))


def _npy_member(row: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, row)
    return out.getvalue()


def _write_array_tars(out: Path, source: str, shard: int) -> None:
    import webdataset as wds

    array = np.load(source, mmap_mode="r")
    # encoder=False: the members are given as bytes (the row's .npy, as webdataset's own "npy" encoder writes).
    with wds.ShardWriter(str(out / "shard-%05d.tar"), maxsize=shard, maxcount=1 << 40, verbose=0, encoder=False) as w:
        for i in range(len(array)):
            w.write({"__key__": f"{i:09d}", "npy": _npy_member(array[i])})


def _write_litdata(out: Path, source: str, shard: int) -> None:
    import litdata

    rows = len(np.load(source, mmap_mode="r"))
    step = 4096
    ranges = [(start, min(start + step, rows)) for start in range(0, rows, step)]
    # One worker writes the rows in order, so the chunks hold them in the file's order.
    litdata.optimize(
        fn=_LitdataRows(source), inputs=ranges, output_dir=str(out), chunk_bytes=shard, num_workers=1, verbose=False
    )


class _LitdataRows:
    """``litdata.optimize``'s function: each row of a range of rows, one item each (a picklable callable)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __call__(self, bounds: tuple[int, int]) -> Iterable[np.ndarray]:
        array = np.load(self.source, mmap_mode="r")
        for i in range(*bounds):
            yield np.array(array[i])


def _write_tfrecords(out: Path, source: str, shard: int) -> None:
    import tensorflow as tf

    array = np.load(source, mmap_mode="r")
    per_file = max(1, shard // array[0].nbytes)
    for number, start in enumerate(range(0, len(array), per_file)):
        with tf.io.TFRecordWriter(str(out / f"part-{number:05d}.tfrecord")) as writer:
            for row in array[start : start + per_file]:
                feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[row.tobytes()]))
                example = tf.train.Example(features=tf.train.Features(feature={"x": feature}))
                writer.write(example.SerializeToString())


def _write_image_tars(out: Path, source: str, shard: int) -> None:
    import webdataset as wds

    with wds.ShardWriter(str(out / "shard-%05d.tar"), maxsize=shard, maxcount=1 << 40, verbose=0, encoder=False) as w:
        for path in _jpeg_files(source):
            w.write({"__key__": Path(path).stem, "jpg": Path(path).read_bytes()})


_CONVERTERS = {
    "tar": _write_array_tars,
    "litdata": _write_litdata,
    "tfrecord": _write_tfrecords,
    "image-tar": _write_image_tars,
}


def convert_child(kind: str, out: str, source: str, shard: int) -> float:
    """Write the copy ``kind`` of ``source`` into ``out`` (in this interpreter); seconds it took, imports apart."""
    __import__({"tar": "webdataset", "image-tar": "webdataset", "litdata": "litdata", "tfrecord": "tensorflow"}[kind])
    Path(out).mkdir(parents=True)
    start = time.perf_counter()
    _CONVERTERS[kind](Path(out), source, shard)
    return time.perf_counter() - start


def ensure_copy(kind: str, source: str, data: str, shard: int) -> dict[str, Any]:
    """The converted copy ``kind`` of ``source`` (``data`` says what that is), in shards of ``shard`` bytes: written
    in a fresh interpreter unless a complete one is there. Its directory, the seconds writing it took and its bytes,
    or ``error``."""
    suffix = {"tar": "wds", "image-tar": "wds", "litdata": "litdata", "tfrecord": "tfrecords"}[kind]
    path = Path(source).parent / f"{Path(source).stem}-shards{shard}.{suffix}"
    record = path / "converted.json"
    if not record.exists():
        # Written under another name and renamed once complete, as benchmarks.samples writes its files.
        partial = path.with_name(path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)
        try:
            seconds = in_child(["--convert", kind, str(partial), source, str(shard)])
        except ChildFailed as failed:
            shutil.rmtree(partial, ignore_errors=True)
            return {"kind": kind, "data": data, "error": str(failed)}
        written = sum(p.stat().st_size for p in partial.rglob("*") if p.is_file())
        (partial / "converted.json").write_text(json.dumps({"seconds": seconds, "bytes": written, "source": source}))
        os.replace(partial, path)
        print(f"{kind}: wrote {path} ({format_bytes(written)}) in {seconds:.1f} s")
    source_path = Path(source)
    files = [source_path] if source_path.is_file() else [p for p in source_path.iterdir() if p.is_file()]
    read = sum(p.stat().st_size for p in files)
    return {"kind": kind, "data": data, "where": str(path), "source_bytes": read, **json.loads(record.read_text())}


def _write_photo(args: tuple[str, int, int, int]) -> None:
    from PIL import Image

    from benchmarks.images import photo

    folder, height, width, index = args
    Image.fromarray(photo(height, width, index)).save(os.path.join(folder, f"{index:06d}.jpg"), quality=90)


def ensure_photos(count: int, width: int, height: int) -> Path:
    """A folder of ``count`` photo-like JPEGs (:func:`benchmarks.images.photo`), written once and reused."""
    import multiprocessing

    from benchmarks.samples import DATA_DIR

    path = DATA_DIR / f"photos-{width}x{height}-{count}"
    if path.exists():
        return path
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool() as pool:
        pool.map(_write_photo, [(str(partial), height, width, i) for i in range(count)], chunksize=16)
    os.replace(partial, path)
    print(f"{IMAGES}: wrote {count} photos {width}x{height} into {path} in {time.perf_counter() - start:.1f} s")
    return path


def warm(path: str) -> None:
    """Read every byte under ``path`` once (a file, or a directory's files): the page cache holds them after."""
    root = Path(path.partition("::")[0])
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    buffer = bytearray(16 << 20)
    for file in files:
        with open(file, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass


# -- the rounds ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """One layout: its label, the unit of its items, what each contender reads, and the training step (s)."""

    key: str
    kind: str
    label: str
    reads: dict[str, str]
    window: str
    step: float = 0.0

    @property
    def unit(self) -> str:
        return "images" if self.kind == "images" else "rows"


def _stream_window(where: Any, batch: int, unit: str) -> str:
    """How many items a daskstream shuffle window holds (``shuffle_blocks`` shards)."""
    import daskstream as ds

    s = ds.stream(where, batch_size=batch, shuffle=True, seed=0)
    largest = max(stop - start for start, stop in s.block_bounds)
    return f"{s.shuffle_blocks} shards of at most {largest:,} {unit}"


@dataclass(frozen=True)
class Settings:
    """What every run shares (see :func:`main`'s options)."""

    batch: int = 256
    workers: int = 2
    repeats: int = 3
    limit: float = 5.0
    images: int = 1000
    photo: tuple[int, int] = (500, 375)
    target: tuple[int, int] = (224, 224)
    image_batch: int = 64
    buffer: int = 8192
    image_buffer: int = 1000
    shard: int = 64 << 20
    step: bool = True

    def run(self, table: Table, name: str, where: str, order: str, step: float = 0.0) -> Run:
        images = table.kind == "images"
        return Run(
            loader=name, where=where, shuffled=order == "shuffled", batch=self.image_batch if images else self.batch,
            workers=self.workers, limit=self.limit, step=step, buffer=self.image_buffer if images else self.buffer,
            size=(self.target[1], self.target[0]),
        )  # fmt: skip


def prepare(keys: list[str], size: int, names: list[str], settings: Settings) -> tuple[list[Table], list[dict]]:
    """The layouts' tables (data written, copies converted, everything read once) and the conversions made."""
    from benchmarks.samples import LAYOUTS, ensure

    tables: list[Table] = []
    conversions: list[dict[str, Any]] = []
    arrays = [n for n in names if _key("arrays", n) in CONTENDERS]
    images = [n for n in names if _key("images", n) in CONTENDERS]
    array_keys = [k for k in keys if k != IMAGES]
    if array_keys and arrays:
        npy = ensure("npy", size)
        # The copies hold the same rows whatever the layout: one table of their own, shown with every layout's.
        copies: dict[str, str] = {}
        for name in arrays:
            copy = CONTENDERS[_key("arrays", name)].copy
            if copy:
                made = ensure_copy(copy, npy, f"{format_bytes(size)} .npy", shard_bytes(size, settings.shard))
                conversions.append(made)
                copies[name] = made.get("where", "")
        for key in array_keys:
            where = ensure(key, size)
            reads = {n: where for n in arrays if not CONTENDERS[_key("arrays", n)].copy}
            tables.append(
                Table(key, "arrays", LAYOUTS[key].label, reads, _stream_window(where, settings.batch, "rows"))
            )
        if copies:
            tables.append(Table(COPIES, "arrays", "converted copies", copies, ""))
    if IMAGES in keys and images:
        import daskstream as ds

        width, height = settings.photo
        folder = str(ensure_photos(settings.images, width, height))
        reads = {n: folder for n in images if not CONTENDERS[_key("images", n)].copy}
        if len(reads) < len(images):
            total = sum(p.stat().st_size for p in Path(folder).iterdir())
            made = ensure_copy("image-tar", folder, f"{settings.images:,} JPEGs", shard_bytes(total, settings.shard))
            conversions.append(made)
            reads.update({n: made.get("where", "") for n in images if CONTENDERS[_key("images", n)].copy})
        source = ds.open_images(folder, size=settings.target[::-1], labels=None).images
        label = f"JPEG folder, {settings.images:,} photos {width}x{height} -> {settings.target[0]}x{settings.target[1]}"
        tables.append(Table(IMAGES, "images", label, reads, _stream_window(source, settings.image_batch, "images")))
    for where in {w for t in tables for w in t.reads.values() if w}:
        warm(where)
    return tables, conversions


def run(
    keys: list[str],
    size: int,
    batch: int,
    workers: int,
    repeats: int,
    row_seconds: float,
    *,
    contenders: Iterable[str] = ORIGINAL,
    orders: Iterable[str] = ("shuffled",),
    **options: Any,
) -> list[dict[str, Any]]:
    """Every contender of ``contenders`` on every layout of ``keys``, in every order of ``orders``: one row each.

    ``keys`` are :data:`benchmarks.samples.LAYOUTS` keys and ``"jpeg"``;
    ``options`` are :class:`Settings`' other fields. The defaults (the three
    PyTorch loaders, shuffled) are what :mod:`benchmarks.stream` reports.
    """
    settings = Settings(batch=batch, workers=workers, repeats=repeats, limit=row_seconds, **options)
    orders = list(orders)
    tables, conversions = prepare(keys, size, list(contenders), settings)

    # The training step: as long as StreamDataset's shuffled time per batch, from a calibration run of its own.
    if settings.step and "shuffled" in orders:
        for i, table in enumerate(tables):
            if "StreamDataset" in table.reads and table.kind == "arrays":
                (found,) = spawn(
                    "arrays", [settings.run(table, "StreamDataset", table.reads["StreamDataset"], "shuffled")]
                )
                if "error" not in found and found["rows"]:
                    tables[i] = dataclasses.replace(table, step=batch * found["seconds"] / found["rows"])

    # Rounds of every (layout, contender) once, both orders in one interpreter (their sequence alternating by round).
    results: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    started = time.perf_counter()
    for round_ in range(repeats):
        sequence = orders if round_ % 2 == 0 else orders[::-1]
        for table in tables:
            for name, where in table.reads.items():
                stepped = table.step if CONTENDERS[_key(table.kind, name)].stepped else 0.0
                runs = [settings.run(table, name, where, o, stepped if o == "shuffled" else 0.0) for o in sequence]
                for order, result in zip(sequence, spawn(table.kind, runs), strict=True):
                    results.setdefault((table.key, name, order), []).append(result)
                    shown = result.get("error") or f"{result['rows'] / result['seconds']:,.0f} {table.unit}/s"
                    print(
                        f"[{time.perf_counter() - started:5.0f} s] round {round_ + 1}: {table.key}, {name}, {order}: "
                        f"{shown}"
                    )
    rows = [
        summary(table, name, order, results[table.key, name, order], settings)
        for table in tables
        for order in orders
        for name in table.reads
    ]
    if conversions:
        rows.append({"conversions": conversions})
    return rows


def summary(table: Table, name: str, order: str, results: list[dict[str, Any]], settings: Settings) -> dict[str, Any]:
    """One contender's row: medians of its runs."""
    contender = CONTENDERS[_key(table.kind, name)]
    images = table.kind == "images"
    buffer = settings.image_buffer if images else settings.buffer
    row: dict[str, Any] = {
        "layout": table.label,
        "layout_key": table.key,
        "loader": name,
        "order": order,
        "daskstream": contender.daskstream,
        "copy": contender.copy,
        "shuffle": contender.shuffle.format(buffer=f"{buffer:,}", window=table.window)
        if order == "shuffled"
        else "none",
        "workers": 0 if name.endswith("num_workers=0") else settings.workers,
        "batch": settings.image_batch if images else settings.batch,
        "unit": table.unit,
        "runs": results,
    }
    good = [r for r in results if "error" not in r]
    if not good:
        row["error"] = results[-1]["error"]
        return row
    row.update(
        rows=int(statistics.median(r["rows"] for r in good)),
        seconds=statistics.median(r["seconds"] for r in good),
        rows_per_second=statistics.median(r["rows"] / r["seconds"] for r in good),
        setup_seconds=statistics.median(r["setup_seconds"] for r in good),
        partial=any(r["seconds"] >= settings.limit for r in good),
        step_seconds=0.0,
    )
    stepped = [r["stepped"] for r in good if "stepped" in r]
    if stepped:
        row["step_seconds"] = table.step
        row["waited_share"] = statistics.median(s["waited_seconds"] / s["seconds"] for s in stepped)
    return row


# -- tables ------------------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    found = {}
    for package in ("torch", "tensorflow-cpu", "tensorflow", "webdataset", "litdata", "torchdata", "Pillow", "h5py",
                    "zarr", "numpy"):  # fmt: skip
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found


def _summary(loaders: list[dict[str, Any]], copies: list[dict[str, Any]]) -> list[str]:
    """Per layout and order: daskstream's fastest contender against the fastest other one."""
    lines = [
        "| layout | order | daskstream's fastest | per s | fastest other | per s | ratio |",
        "|---|---|---|---:|---|---:|---:|",
    ]
    for key in dict.fromkeys(r["layout_key"] for r in loaders if r["layout_key"] != COPIES):
        own = [r for r in loaders if r["layout_key"] == key]
        for order in ORDERS:
            shown = [r for r in own + ([] if key == IMAGES else copies) if r["order"] == order and "error" not in r]
            ours = max((r for r in shown if r["daskstream"]), key=lambda r: r["rows_per_second"], default=None)
            theirs = max((r for r in shown if not r["daskstream"]), key=lambda r: r["rows_per_second"], default=None)
            if ours is None or theirs is None:
                continue
            lines.append(
                f"| {own[0]['layout']} | {order} | {ours['loader']} | {ours['rows_per_second']:,.0f} | "
                f"{theirs['loader']} | {theirs['rows_per_second']:,.0f} | "
                f"**{ours['rows_per_second'] / theirs['rows_per_second']:.2f}** |"
            )
    return lines


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    """One table per layout (the converted copies' rows in every array layout's), and the conversions."""
    loaders = [r for r in rows if "loader" in r]
    conversions = [c for r in rows if "conversions" in r for c in r["conversions"]]
    copies = [r for r in loaders if r["layout_key"] == COPIES]
    lines = [header, "", *_summary(loaders, copies), "", SHUFFLES, ""]
    for key in dict.fromkeys(r["layout_key"] for r in loaders if r["layout_key"] != COPIES):
        own = [r for r in loaders if r["layout_key"] == key]
        unit = own[0]["unit"]
        shown = own + ([] if key == IMAGES else copies)
        lines += [
            f"**{own[0]['layout']}**",
            "",
            f"| order | loader | shuffle | {unit}/s | vs best other | epoch timed | setup | step per batch | "
            "loop waited, with step |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for order in ORDERS:
            ranked = [r for r in shown if r["order"] == order]
            others = [r["rows_per_second"] for r in ranked if not r["daskstream"] and "error" not in r]
            best = max(others, default=None)
            for r in ranked:
                name = f"**{r['loader']}**" if r["daskstream"] else r["loader"]
                if r["copy"]:
                    name += f" ({r['copy']} copy)"
                if "error" in r:
                    lines.append(f"| {order} | {name} | {r['shuffle']} | failed: {r['error']} | | | | | |")
                    continue
                ratio = f"{r['rows_per_second'] / best:.2f}" if best else "-"
                timed = f"{r['rows']:,} {unit} in {r['seconds']:.2f} s" + (" (stopped)" if r["partial"] else "")
                step, waited = "-", "-"
                if "waited_share" in r:
                    step, waited = f"{1e3 * r['step_seconds']:.1f} ms", f"{100 * r['waited_share']:.1f}%"
                lines.append(
                    f"| {order} | {name} | {r['shuffle']} | {r['rows_per_second']:,.0f} | {ratio} | {timed} | "
                    f"{r['setup_seconds']:.2f} s | {step} | {waited} |"
                )
        lines.append("")
    if conversions:
        lines += [
            "Converted copies (written once, reused; not counted in any epoch):",
            "",
            "| copy | of | bytes written | seconds | MiB/s of the data |",
            "|---|---|---:|---:|---:|",
        ]
        for c in conversions:
            if "error" in c:
                lines.append(f"| {c['kind']} | {c['data']} | failed: {c['error']} | | |")
                continue
            rate = c["source_bytes"] / c["seconds"] / 2**20
            lines.append(
                f"| {c['kind']} | {c['data']} | {format_bytes(c['bytes'])} | {c['seconds']:.1f} | {rate:,.0f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="128MiB", help="Bytes of each array layout.")
    parser.add_argument("--only", default="npy,hdf5-gzip,zarr-zstd,jpeg", help="Layouts: samples' keys and jpeg.")
    parser.add_argument("--contenders", default="", help="Comma-separated names (default: all).")
    parser.add_argument("--orders", default="shuffled,in order")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epoch-seconds", type=float, default=5.0, help="An epoch is stopped after this long.")
    parser.add_argument("--buffer", type=int, default=8192, help="webdataset's and TFRecord's shuffle buffer (rows).")
    parser.add_argument("--shard", default="64MiB", help="Shards of the converted copies, at most.")
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--photo", default="500x375", help="width x height of the photos")
    parser.add_argument("--target", default="224x224", help="width x height they are resized to")
    parser.add_argument("--image-batch", type=int, default=64)
    parser.add_argument("--image-buffer", type=int, default=1000)
    parser.add_argument("--no-step", action="store_true", help="Leave out the epochs with a training step.")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "loaders"))
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--convert", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        runs = [Run(**{**settings, "size": tuple(settings["size"])}) for settings in json.loads(args.child[1])]
        print(RESULT + json.dumps(child(args.child[0], runs)), flush=True)
        # Without waiting for loader workers and tf.data's threads to wind down: the result is out.
        os._exit(0)
    if args.convert:
        kind, out, source, shard = args.convert
        print(RESULT + json.dumps(convert_child(kind, out, source, int(shard))), flush=True)
        os._exit(0)
    size = int(parse_bytes(args.size))
    keys = [k for k in args.only.split(",") if k]
    names = [n.strip() for n in args.contenders.split(",") if n.strip()] or list(
        dict.fromkeys([*ARRAY_CONTENDERS, *IMAGE_CONTENDERS])
    )
    photo = tuple(int(n) for n in args.photo.split("x"))
    target = tuple(int(n) for n in args.target.split("x"))
    rows = run(
        keys, size, args.batch, args.workers, args.repeats, args.epoch_seconds, contenders=names,
        orders=[o.strip() for o in args.orders.split(",")], images=args.images, photo=photo, target=target,
        image_batch=args.image_batch, buffer=args.buffer, image_buffer=args.image_buffer,
        shard=int(parse_bytes(args.shard)), step=not args.no_step,
    )  # fmt: skip
    command = "python -m benchmarks.loaders " + " ".join(argv if argv is not None else sys.argv[1:])
    from benchmarks.open_sum import machine_info

    machine = machine_info(args.workers)
    versions = {**machine["versions"], **_versions()}
    header = "\n".join(
        [
            f"`{command.strip()}`",
            "",
            f"An epoch of {format_bytes(size)} float32 arrays (4 KiB rows, batches of {args.batch}) and of "
            f"{args.images:,} JPEGs (batches of {args.image_batch}), warm page cache, {args.workers} loader workers "
            f"(tf.data: a private pool of {args.workers} threads), each contender run in a fresh interpreter, "
            f"medians of {args.repeats} interleaved runs; epochs stopped after {args.epoch_seconds:g} s.",
            "",
            f"- machine: {machine['cpu']}, {machine['usable_cores']} usable cores, "
            f"{format_bytes(machine['ram_bytes'])}",
            "- " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        ]
    )
    text = markdown(rows, header)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"command": command, "machine": machine, "rows": rows}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
