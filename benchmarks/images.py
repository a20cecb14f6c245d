"""JPEG decode + resize to a training size: Pillow, simplejpeg and imagecodecs, on threads.

``--count`` photo-like JPEGs (smooth gradients, soft blobs and sensor-like noise,
Pillow quality 90, 4:2:0) of each ``--sizes`` are written to a temporary folder;
every contender then turns each file's bytes into a ``--target`` RGB uint8
array, ``--threads`` images at once (a thread pool over the files), in a fresh
interpreter per timing: after one untimed pass over a few images (imports, the
pool, first-use caches), the whole set is timed. Rounds run every contender
once in turn (A B C A B C...); the table gives medians of ``--repeats`` in
images a second, and how much faster the threads run than one (1.0: the
decoder holds the GIL).

Contenders (each resizes with Pillow's antialiased bilinear filter, as
``daskstream.sources.images.folder`` does):

* ``pillow``: ``Image.open`` + ``convert("RGB")`` + ``resize``;
* ``pillow draft``: the same after ``Image.draft("RGB", target)``, which has
  libjpeg decode at 1/2, 1/4 or 1/8 scale where the result stays at least the
  target size (DCT scaling);
* ``simplejpeg``: ``decode_jpeg(data, "RGB")`` + ``resize``;
* ``simplejpeg scaled``: ``decode_jpeg(..., min_height=, min_width=)`` (libjpeg-turbo's
  DCT scaling, the same rule) + ``resize``;
* ``imagecodecs``: ``jpeg8_decode(data)`` (libjpeg-turbo, no scaled decoding) + ``resize``;
* ``ds.open_images``: ``source.read()`` of the folder opened with ``threads=``
  (Pillow with draft, as chosen; reading the files included). Its open -- a
  header check of every file, on the same threads -- is timed apart (a second
  open, the first having imported Pillow's readers) and given per file;
  ``ds.open_images fast``: the same with ``quality="fast"`` (JPEGs decoded
  down to half the target's pixels in each direction, then resampled).

Pipelines, as a training loop runs them: two epochs in batches of 64, timed
together and given per epoch (the first batch of tf.data's, which traces it,
untimed):

* ``tf.data``: tf.data's pipeline as its guide writes it --
  ``from_tensor_slices(files).map(read_file + decode_jpeg + resize,
  num_parallel_calls=AUTOTUNE).batch(64).prefetch(AUTOTUNE)`` on a private
  pool of ``--threads`` threads; ``tf.image.resize``'s default, bilinear
  without antialiasing (cheaper, aliased when it shrinks);
  ``tf.data antialias`` with ``antialias=True``;
* ``ds.stream`` and ``ds.stream fast``: ``ds.stream(open_images(...).images,
  batch_size=64, shuffle=True)`` with ``num_workers`` set to ``--threads``,
  accurate and fast (reading the second epoch's first images during the
  first's last batches, as by default).

Quality: the PSNR of each contender's arrays against Pillow's full decode
resized with Lanczos (higher is closer; the full-decode contenders' own figure
is the bilinear filter's).

    python -m benchmarks.images [--count 64] [--sizes 500x375,1024x768] [--target 224x224]
                                [--threads 2] [--repeats 5] [--contenders a,b,...]
                                [--out benchmarks/results/images]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.open_sum import machine_info, usable_cpus
from benchmarks.timing import write_results

REPOSITORY = Path(__file__).resolve().parent.parent
CONTENDERS = (
    "pillow",
    "pillow draft",
    "simplejpeg",
    "simplejpeg scaled",
    "imagecodecs",
    "ds.open_images",
    "ds.open_images fast",
    "tf.data",
    "tf.data antialias",
    "ds.stream",
    "ds.stream fast",
)

# Runs in a fresh interpreter: decodes every file of a folder to the target size, threads at once.
TIMER = r"""
import concurrent.futures, io, json, os, sys, time
import numpy as np
from PIL import Image

name, folder, threads, height, width = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".jpg"))
blobs = [open(f, "rb").read() for f in files]
BILINEAR = Image.Resampling.BILINEAR

def resized(image):
    return np.asarray(image.resize((width, height), BILINEAR))

if name == "pillow":
    def decode(data):
        return resized(Image.open(io.BytesIO(data)).convert("RGB"))
elif name == "pillow draft":
    def decode(data):
        image = Image.open(io.BytesIO(data))
        image.draft("RGB", (width, height))
        return resized(image.convert("RGB"))
elif name.startswith("simplejpeg"):
    import simplejpeg
    scaled = name.endswith("scaled")
    def decode(data):
        limits = {"min_height": height, "min_width": width} if scaled else {}
        return resized(Image.fromarray(simplejpeg.decode_jpeg(data, "RGB", **limits)))
elif name == "imagecodecs":
    import imagecodecs
    def decode(data):
        return resized(Image.fromarray(imagecodecs.jpeg8_decode(data)))

opened = None
quality = "fast" if name.endswith(" fast") else "accurate"
if name.startswith("ds.open_images"):
    import daskstream as ds
    ds.open_images(folder, size=(height, width), threads=threads)  # (imports Pillow's readers: timed apart)
    start = time.perf_counter()
    source = ds.open_images(folder, size=(height, width), threads=threads, quality=quality).images
    opened = time.perf_counter() - start
    source.read((slice(0, 2 * threads),))
    start = time.perf_counter()
    out = source.read()
    seconds = time.perf_counter() - start
elif name.startswith("ds.stream"):
    # The pipeline a training loop iterates: shuffled batches of 64, read ahead on the stream's threads.
    import dask
    import daskstream as ds
    with dask.config.set(num_workers=threads):
        source = ds.open_images(folder, size=(height, width), labels=None, threads=threads, quality=quality).images
        stream = ds.stream(source, batch_size=64, shuffle=True, seed=0)
        start = time.perf_counter()
        batches = [batch for batch in stream]
        batches += [batch for batch in stream][:0]  # the second epoch, timed with the first
        seconds = (time.perf_counter() - start) / 2
    out = list(np.concatenate(batches))
    if len(sys.argv) > 6:  # compared image by image: the in-order stream of the same files
        out = list(np.concatenate(list(ds.stream(source, batch_size=64, read_next_epoch=False))))
elif name.startswith("tf.data"):
    # tf.data's pipeline as its guide writes it: decode_jpeg, resize (bilinear; antialias=False unless
    # named), parallel map, batch, prefetch, on a private pool of `threads` threads.
    import tensorflow as tf
    antialias = name.endswith("antialias")
    def load(path):
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        return tf.cast(tf.image.resize(image, (height, width), antialias=antialias), tf.uint8)
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    pipeline = (
        tf.data.Dataset.from_tensor_slices(files)
        .map(load, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(64)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(options)
    )
    for _ in pipeline.take(1):
        pass  # traced and started once, untimed
    start = time.perf_counter()
    batches = [batch.numpy() for batch in pipeline]
    batches += [batch.numpy() for batch in pipeline][:0]  # the second epoch, timed with the first
    seconds = (time.perf_counter() - start) / 2
    out = list(np.concatenate(batches))
else:
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(decode, blobs[: 2 * threads]))
        start = time.perf_counter()
        out = list(pool.map(decode, blobs))
        seconds = time.perf_counter() - start
if len(sys.argv) > 6:
    np.save(sys.argv[6], np.stack(out))
print(json.dumps({"seconds": seconds, "opened": opened}))
"""


def photo(height: int, width: int, seed: int) -> np.ndarray:
    """A photo-like RGB image: smooth gradients, a few soft blobs (edges at many scales) and mild noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b = rng.uniform(-1, 1, 2)
        image[..., c] = 128 + 60 * (a * x / width + b * y / height)
    for _ in range(12):
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        r = rng.uniform(0.03, 0.3) * min(height, width)
        blob = np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * r * r))
        image += blob[..., None] * rng.uniform(-80, 80, 3)
    image += rng.normal(0, 6, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def write_photos(folder: Path, height: int, width: int, count: int) -> None:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.fromarray(photo(height, width, i)).save(folder / f"{i:05d}.jpg", quality=90)


def reference(folder: Path, height: int, width: int) -> np.ndarray:
    """Each file decoded in full by Pillow and resized with Lanczos: what the contenders' quality is measured against."""
    from PIL import Image

    out = []
    for path in sorted(folder.glob("*.jpg")):
        with Image.open(path) as image:
            out.append(np.asarray(image.convert("RGB").resize((width, height), Image.Resampling.LANCZOS)))
    return np.stack(out)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def timed(name: str, folder: Path, threads: int, target: tuple[int, int], keep: str | None = None) -> dict[str, Any]:
    """``{"seconds": ..., "opened": ...}`` of one fresh interpreter's run (``opened``: ds.open_images only)."""
    command = [sys.executable, "-c", TIMER, name, str(folder), str(threads), *map(str, target)]
    done = subprocess.run(
        [*command, *([keep] if keep else [])], capture_output=True, text=True, check=True, cwd=REPOSITORY
    )
    return json.loads(done.stdout)


def versions(contenders: list[str]) -> dict[str, str]:
    import PIL
    from PIL import features

    found = {"Pillow": PIL.__version__, "Pillow libjpeg-turbo": str(features.version("libjpeg_turbo"))}
    if any(name.startswith("simplejpeg") for name in contenders):
        import simplejpeg

        found["simplejpeg"] = simplejpeg.__version__
    if "imagecodecs" in contenders:
        import imagecodecs

        found["imagecodecs"] = imagecodecs.__version__
        found["imagecodecs libjpeg"] = imagecodecs.jpeg8_version()
    if any(name.startswith("tf.data") for name in contenders):
        import tensorflow as tf

        found["tensorflow"] = tf.__version__
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--sizes", default="500x375,1024x768", help="width x height of the photos, comma-separated")
    parser.add_argument("--target", default="224x224", help="width x height decoded to")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="write <out>.md and <out>.json")
    parser.add_argument(
        "--contenders", default=",".join(CONTENDERS), help=f"comma-separated, of: {', '.join(CONTENDERS)}"
    )
    args = parser.parse_args(argv)
    contenders = args.contenders.split(",")
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        parser.error(f"unknown contenders: {', '.join(unknown)}")
    tw, th = (int(n) for n in args.target.split("x"))
    rows: list[dict[str, Any]] = []
    opened_us: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for size in args.sizes.split(","):
            w, h = (int(n) for n in size.split("x"))
            folder = Path(scratch) / size
            write_photos(folder, h, w, args.count)
            best = reference(folder, th, tw)
            quality = {}
            for name in contenders:
                kept = os.path.join(scratch, "out.npy")
                timed(name, folder, 1, (th, tw), kept)
                quality[name] = psnr(np.load(kept), best)
            times: dict[tuple[str, int], list[float]] = {}
            opens: list[float] = []
            for _ in range(max(3, args.repeats)):
                for name in contenders:
                    for threads in sorted({1, args.threads}):
                        run = timed(name, folder, threads, (th, tw))
                        times.setdefault((name, threads), []).append(run["seconds"])
                        if run["opened"] is not None and threads == args.threads:
                            opens.append(run["opened"])
            for name in contenders:
                one = statistics.median(times[name, 1])
                many = statistics.median(times[name, args.threads])
                rows.append(
                    {
                        "photos": size,
                        "contender": name,
                        "images/s, 1 thread": args.count / one,
                        f"images/s, {args.threads} threads": args.count / many,
                        "speed-up": one / many,
                        "PSNR dB": quality[name],
                    }
                )
            if opens:
                opened_us[size] = statistics.median(opens) / args.count * 1e6
            print(f"{size} done", file=sys.stderr)
    command = "python -m benchmarks.images " + " ".join(argv if argv is not None else sys.argv[1:])
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
    machine = machine_info(args.threads)
    info = {
        "cpu": machine["cpu"],
        "usable CPUs": usable_cpus(),
        "python": machine["versions"]["python"],
        **versions(contenders),
    }
    opening = [
        f"- ds.open_images, header check at open: {us:.0f} us a file ({size}, {args.threads} threads)"
        for size, us in opened_us.items()
    ]
    table = "\n".join([f"`{command.strip()}`", "", *(f"- {k}: {v}" for k, v in info.items()), "", *lines, "", *opening])
    print(table)
    write_results(args.out, table, {"command": command, "machine": info, "rows": rows, "open_us_per_file": opened_us})


if __name__ == "__main__":
    main()
