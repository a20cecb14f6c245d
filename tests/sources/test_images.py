"""open_images: folders, patterns, lists and tars of JPEG and PNG files as one uint8 array, checked against Pillow.

The oracle is Pillow itself, called directly on each file: ``Image.open``, the
same JPEG scaled decoding (``Image.draft``), then ``resize`` (stretch),
``ImageOps.fit`` (crop) or ``ImageOps.pad`` (pad) with the bilinear filter.
Where daskstream takes the same decoder path the arrays must be equal to the
bit; the one comparison with another path (a full-size decode) states its
tolerance.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import re
import struct
import subprocess
import sys
import tarfile
import threading
import time
import zlib
from pathlib import Path

import cloudpickle
import dask.array as da
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import basic_indices
from PIL import Image, ImageOps
from source_helpers import bump_mtime

import daskstream as ds
from daskstream.errors import (
    CorruptSourceError,
    DaskstreamError,
    InvalidArgumentError,
    SkippedImagesWarning,
    SourceChangedError,
    SourceNotFoundError,
    SourceRemovedError,
    UnknownFormatError,
)
from daskstream.sources.images.codec import DecodeSpec, decode_into
from daskstream.sources.images.reads import run_parallel

SIZE = (32, 48)  # (height, width), as open_images takes it
BILINEAR = Image.Resampling.BILINEAR

# Each class's files: (extension, width, height). Sizes vary so that every path of the resample runs:
# JPEGs of twice the target and more decode at 1/2 or 1/4 scale (Image.draft), the others at full scale.
LAYOUT = {
    "cat": [(".jpg", 130, 100), (".jpg", 90, 120), (".png", 60, 50), (".jpg", 210, 160), (".png", 48, 32)],
    "dog": [(".jpg", 75, 75), (".png", 40, 90), (".jpg", 200, 150), (".jpg", 33, 21)],
    "fox": [(".jpg", 64, 48), (".png", 100, 100), (".jpg", 160, 300)],
}


def photo(width: int, height: int, seed: int) -> np.ndarray:
    """A small photo-like RGB image: smooth gradients, a soft blob and mild noise (JPEG's usual subject)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b = rng.uniform(-1, 1, 2)
        image[..., c] = 128 + 60 * (a * x / width + b * y / height)
    cy, cx, r = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(0.1, 0.4) * min(width, height)
    image += np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * r * r))[..., None] * rng.uniform(-80, 80, 3)
    image += rng.normal(0, 6, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def save(path: Path, pixels: np.ndarray, **options) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jpg":
        options.setdefault("quality", 90)
    Image.fromarray(pixels).save(path, **options)
    return path


def contained(image_size, box) -> tuple[int, int]:
    """The (width, height) ImageOps.contain fits an image of ``image_size`` to within ``box``.

    (0, 0) where it rounds a side to nothing: Pillow before 10.4 refuses that resize, later ones return it.
    """
    try:
        return ImageOps.contain(Image.new("L", image_size), box).size
    except ValueError:
        return (0, 0)


def oracle(path, size=SIZE, mode="RGB", resize="stretch") -> np.ndarray:
    """What Pillow itself makes of the file, as (height, width, channels)."""
    height, width = size
    with Image.open(path) as image:
        if image.format == "JPEG":
            # Scaled decoding to at least what the resample needs; for pad, the size ImageOps fits it to.
            fitted = contained(image.size, (width, height))
            image.draft(mode, fitted if resize == "pad" else (width, height))
        image = image.convert(mode)
        if resize == "stretch":
            out = image.resize((width, height), BILINEAR)
        elif resize == "crop":
            out = ImageOps.fit(image, (width, height), BILINEAR)
        else:
            out = ImageOps.pad(image, (width, height), BILINEAR)
    return np.asarray(out).reshape(height, width, -1)


def stacked(paths, **kw) -> np.ndarray:
    return np.stack([oracle(p, **kw) for p in paths])


@pytest.fixture
def photos(tmp_path) -> tuple[Path, list[Path]]:
    """A folder of class folders (12 JPEG and PNG files), with what a real folder holds beside them."""
    root = tmp_path / "photos"
    files = []
    seed = 0
    for name, kinds in LAYOUT.items():
        for i, (ext, width, height) in enumerate(kinds):
            files.append(save(root / name / f"{i}{ext}", photo(width, height, seed)))
            seed += 1
    (root / "README.txt").write_text("photos of animals\n")
    (root / "cat" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / "cat" / "._0.jpg").write_bytes(b"\0\5\26\7AppleDouble")  # macOS's companion file: not an image
    (root / ".ipynb_checkpoints").mkdir()
    (root / ".ipynb_checkpoints" / "x.jpg").write_bytes(b"not a picture")
    return root, files


# --- values ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("resize", ["stretch", "crop", "pad"])
def test_every_image_is_pillows_own_decode_and_resize(photos, mode, resize):
    root, files = photos
    folder = ds.open_images(root, size=SIZE, mode=mode, resize=resize)
    channels = 3 if mode == "RGB" else 1
    assert folder.images.shape == (12, *SIZE, channels)
    assert folder.images.dtype == np.uint8
    assert folder.files == tuple(str(f) for f in files)  # sorted, class by class; other files left out
    got = folder.images.read()
    np.testing.assert_array_equal(got, stacked(files, mode=mode, resize=resize))


def test_labels_are_the_sorted_class_folders(photos):
    root, _ = photos
    folder = ds.open_images(root, size=SIZE)
    assert folder.classes == ("cat", "dog", "fox")
    assert folder.labels.dtype == np.int64
    assert folder.labels.tolist() == [0] * 5 + [1] * 4 + [2] * 3
    assert folder.skipped == []
    assert len(folder) == 12


@settings(max_examples=60, deadline=None)
@given(
    image=st.tuples(st.integers(1, 70), st.integers(1, 70)),
    target=st.tuples(st.integers(1, 40), st.integers(1, 40)),
    resize=st.sampled_from(["stretch", "crop", "pad"]),
)
def test_the_resize_policies_are_imageops_for_any_sizes(image, target, resize):
    # The brute-force oracle: Pillow's ImageOps.fit (crop) and ImageOps.pad, on every pair of sizes, odd
    # margins and one-pixel images included. PNG, so that no scaled decoding comes between.
    width, height = image
    if resize == "pad":
        # Where ImageOps rounds a fitted side to nothing (a blank result), daskstream keeps one pixel of it.
        assume(min(contained(image, target[::-1])) > 0)
    buffer = io.BytesIO()
    Image.fromarray(photo(width, height, width * 100 + height)).save(buffer, format="PNG")
    spec = DecodeSpec.checked(target, "RGB", resize, True, 10**6)
    got = np.zeros((*target, 3), np.uint8)
    decode_into(buffer.getvalue(), got, spec)
    buffer.seek(0)
    np.testing.assert_array_equal(got, oracle(buffer, size=target, resize=resize))


def test_scaled_jpeg_decoding_is_as_good_as_a_full_decode(tmp_path):
    # Another decoder path than the oracle's: JPEG decoded at 1/4 scale, against a full-size decode resized.
    path = save(tmp_path / "big.jpg", photo(400, 300, 7))
    got = ds.open_images([path], size=SIZE).images.read()[0].astype(float)
    with Image.open(path) as image:
        full = np.asarray(image.convert("RGB").resize(SIZE[::-1], BILINEAR)).astype(float)
    assert np.abs(got - full).mean() < 1.5  # grey levels of 255
    assert np.abs(got - full).max() < 24


@pytest.mark.parametrize("resize", ["stretch", "crop", "pad"])
def test_the_fast_decode_is_a_jpeg_decoded_at_half_the_pixels_then_resampled(tmp_path, resize):
    # A photo four times the target: the accurate path decodes at 1/4 scale, the fast one at 1/8.
    path = save(tmp_path / "big.jpg", photo(4 * SIZE[1], 4 * SIZE[0], 11))
    fast = ds.open_images([path], size=SIZE, resize=resize, quality="fast")
    got = fast.images.read()[0]
    accurate = ds.open_images([path], size=SIZE, resize=resize).images.read()[0]
    with Image.open(path) as image:
        fitted = contained(image.size, SIZE[::-1]) if resize == "pad" else SIZE[::-1]
        image.draft("RGB", tuple(-(-side // 2) for side in fitted))
        assert image.size == (SIZE[1] // 2, SIZE[0] // 2)  # Pillow's own scaled decode, at 1/8
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, format="PNG")
    buffer.seek(0)
    np.testing.assert_array_equal(got, oracle(buffer, size=SIZE, resize=resize))
    # Coarser than the accurate path, but the same picture.
    difference = np.abs(got.astype(float) - accurate)
    assert 0 < difference.mean() < 4
    assert "fast" in repr(fast)


def test_the_fast_decode_leaves_pngs_and_jpegs_below_the_target_as_the_accurate_one(tmp_path):
    # A PNG is decoded whole either way; a JPEG smaller than the target has no smaller scale to take.
    files = [
        save(tmp_path / "big.png", photo(4 * SIZE[1], 4 * SIZE[0], 12)),
        save(tmp_path / "s.jpg", photo(33, 21, 3)),
    ]
    np.testing.assert_array_equal(
        ds.open_images(files, size=SIZE, quality="fast").images.read(), ds.open_images(files, size=SIZE).images.read()
    )


@pytest.mark.parametrize("quality", ["Fast", "draft", None, 1])
def test_an_unknown_quality_is_refused_naming_both(photos, quality):
    root, _ = photos
    with pytest.raises(InvalidArgumentError, match=r"quality=.*'accurate'.*'fast'"):
        ds.open_images(root, size=SIZE, quality=quality)


def test_reads_of_any_part_match_the_whole(photos):
    root, files = photos
    source = ds.open_images(root, size=SIZE).images
    expected = stacked(files)

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(region=basic_indices(source.shape, allow_ellipsis=True, allow_newaxis=False))
    def check(region):
        np.testing.assert_array_equal(source.read(region), expected[region])

    check()


def test_one_thread_and_many_give_the_same_images(photos):
    root, _ = photos
    one = ds.open_images(root, size=SIZE, threads=1).images.read()
    many = ds.open_images(root, size=SIZE, threads=4).images.read()
    np.testing.assert_array_equal(one, many)


def test_exif_orientation_turns_photos_upright(tmp_path):
    pixels = photo(40, 30, 3)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to show"
    path = save(tmp_path / "phone.jpg", pixels, exif=exif.tobytes())
    with Image.open(path) as image:
        upright = ImageOps.exif_transpose(image)
        expected = np.asarray(upright.convert("RGB").resize(SIZE[::-1], BILINEAR))
        as_stored = np.asarray(image.convert("RGB").resize(SIZE[::-1], BILINEAR))
    np.testing.assert_array_equal(ds.open_images([path], size=SIZE).images.read()[0], expected)
    np.testing.assert_array_equal(ds.open_images([path], size=SIZE, exif_orientation=False).images[0], as_stored)


def test_sixteen_bit_greyscale_keeps_its_top_byte(tmp_path):
    # Pillow's own convert clips 16-bit values to 255: such an image would read all white.
    wide = (np.arange(40 * 30, dtype=np.uint16).reshape(30, 40) * 50).astype(np.uint16)
    path = tmp_path / "depth.png"
    Image.fromarray(wide).save(path)
    expected = np.asarray(Image.fromarray((wide >> 8).astype(np.uint8)).resize(SIZE[::-1], BILINEAR))
    got = ds.open_images([path], size=SIZE, mode="L").images.read()
    np.testing.assert_array_equal(got[0, ..., 0], expected)
    assert 0 < got.mean() < 255


# --- where the images are -----------------------------------------------------------------------------------


def test_a_pattern_takes_the_files_it_matches(photos):
    root, files = photos
    jpegs = [f for f in files if f.suffix == ".jpg"]
    folder = ds.open_images(str(root / "**" / "*.jpg"), size=SIZE)
    assert folder.files == tuple(str(f) for f in jpegs)
    assert folder.classes == ("cat", "dog", "fox")  # the folders below the pattern's fixed part
    np.testing.assert_array_equal(folder.images.read(), stacked(jpegs))


def test_a_list_keeps_its_order(photos):
    _, files = photos
    chosen = [files[7], files[0], files[11]]
    folder = ds.open_images(chosen, size=SIZE)
    assert folder.files == tuple(str(f) for f in chosen)
    assert folder.classes == ("cat", "dog", "fox")
    assert folder.labels.tolist() == [1, 0, 2]
    np.testing.assert_array_equal(folder.images.read(), stacked(chosen))


def test_one_image_is_a_folder_of_one(photos):
    _, files = photos
    folder = ds.open_images(files[2], size=SIZE)
    assert folder.images.shape == (1, *SIZE, 3)
    assert folder.labels is None
    np.testing.assert_array_equal(folder.images[0], oracle(files[2]))


def test_a_tar_reads_as_its_folder(photos, tmp_path):
    root, files = photos
    archive = tmp_path / "photos.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname="train")  # README, .DS_Store and the checkpoint folder too: left out alike
    from_tar = ds.open_images(archive, size=SIZE, resize="crop")
    from_folder = ds.open_images(root, size=SIZE, resize="crop")
    assert from_tar.files == tuple(f"{archive}::train/{f.relative_to(root).as_posix()}" for f in files)
    assert from_tar.classes == from_folder.classes
    np.testing.assert_array_equal(from_tar.labels, from_folder.labels)
    np.testing.assert_array_equal(from_tar.images.read(), from_folder.images.read())
    np.testing.assert_array_equal(from_tar.images.read((slice(3, 9),)), stacked(files[3:9], resize="crop"))


def test_a_compressed_tar_says_how_to_decompress_it(photos, tmp_path):
    root, _ = photos
    archive = tmp_path / "photos.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname="train")
    with pytest.raises(UnknownFormatError, match=r"gzip-compressed.*gunzip -k photos\.tar\.gz"):
        ds.open_images(archive, size=SIZE)


# --- labels ---------------------------------------------------------------------------------------------------


def test_a_flat_folder_is_unlabelled_and_a_mixed_one_is_refused(tmp_path):
    for i in range(3):
        save(tmp_path / "flat" / f"{i}.png", photo(20, 20, i))
    folder = ds.open_images(tmp_path / "flat", size=SIZE)
    assert folder.labels is None
    assert folder.classes == ()
    assert folder.summary == "3 images, unlabelled, 32x48 RGB, stretch"
    save(tmp_path / "flat" / "cat" / "4.png", photo(20, 20, 4))
    with pytest.raises(InvalidArgumentError, match=r"3 of 4 images lie in .*flat itself \(0\.png, 1\.png, 2\.png\)"):
        ds.open_images(tmp_path / "flat", size=SIZE)
    assert ds.open_images(tmp_path / "flat", size=SIZE, labels=None).labels is None


@pytest.mark.parametrize(
    ("rows", "expected", "classes"),
    [
        # File names only, string labels: classes sorted, whatever the rows' order.
        ("file,label\n1.png,zebra\n0.png,ant\n2.png,zebra\n", [0, 1, 1], ("ant", "zebra")),
        # Kaggle's form: ids without extension, other column names, a byte-order mark, an extra column.
        ("\ufeffid,width,category\n0,20,b\n1,20,a\n2,20,a\n", [1, 0, 0], ("a", "b")),
        # Whole numbers are the labels themselves.
        ("image,target\n0.png,2\n1.png,0\n2.png,2\n", [2, 0, 2], ("0", "1", "2")),
        # Two columns of any names: file, then label; paths below the folder.
        ("name_of_file,kind\nsub/0.png,x\nsub/1.png,y\nsub/2.png,x\n", [0, 1, 0], ("x", "y")),
    ],
    ids=["names", "kaggle-ids", "numbers", "two-columns-with-paths"],
)
def test_labels_from_a_csv_file(tmp_path, rows, expected, classes):
    for i in range(3):
        save(tmp_path / "data" / "sub" / f"{i}.png", photo(20, 20, i))
    (tmp_path / "labels.csv").write_text(rows, encoding="utf-8")
    folder = ds.open_images(tmp_path / "data", size=SIZE, labels=tmp_path / "labels.csv")
    assert folder.labels.tolist() == expected
    assert folder.classes == classes


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        ("file,label\n0.png,a\n1.png,b\n", r"1 of 3 images have no row \(2\.png\)"),
        ("file,label\n0.png,a\n0.png,b\n1.png,a\n2.png,a\n", r"'0\.png' is labelled twice"),
        ("a,b,c\n0.png,x,y\n", r"cannot tell which column names the files"),
        ("", r"the CSV file is empty"),
        ("file,label\n0.png,\n", r"row 2 has no label"),
    ],
    ids=["unlisted-image", "two-labels", "unknown-columns", "empty", "empty-label"],
)
def test_a_csv_that_does_not_fit_says_why(tmp_path, rows, said):
    for i in range(3):
        save(tmp_path / "data" / f"{i}.png", photo(20, 20, i))
    (tmp_path / "labels.csv").write_text(rows)
    with pytest.raises(InvalidArgumentError, match=said):
        ds.open_images(tmp_path / "data", size=SIZE, labels=str(tmp_path / "labels.csv"))


def test_a_csv_name_matching_two_images_is_refused(tmp_path):
    for name in ("a/0.png", "b/0.png"):
        save(tmp_path / "data" / name, photo(20, 20, 0))
    (tmp_path / "labels.csv").write_text("file,label\n0.png,x\n")
    with pytest.raises(InvalidArgumentError, match=r"row 2 names more than one image \(a/0\.png, b/0\.png\)"):
        ds.open_images(tmp_path / "data", size=SIZE, labels=tmp_path / "labels.csv")


# --- files that are not readable images -----------------------------------------------------------------------


def _truncated_jpeg(path: Path) -> Path:
    data = save(path, photo(120, 90, 1)).read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


BAD_FILES = {
    "text-named-jpg": (lambda p: p.write_text("this is not a picture\n") and p, "not a JPEG or PNG image"),
    "empty": (lambda p: p.write_bytes(b"") or p, "the file is empty"),
    "gif": (lambda p: Image.new("RGB", (8, 8)).save(p, format="GIF") or p, "a GIF image, not JPEG or PNG"),
    "damaged-header": (lambda p: p.write_bytes(b"\xff\xd8\xff\xe0" + b"\0" * 40) and p, "header cannot be read"),
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_a_file_that_is_no_image_is_refused_or_skipped(photos, kind):
    root, files = photos
    make, reason = BAD_FILES[kind]
    bad = root / "dog" / "bad.jpg"
    make(bad)
    with pytest.raises(
        CorruptSourceError,
        match=rf"{re.escape(str(bad))}: not a readable image: .*{re.escape(reason)}.*on_error='skip'",
    ):
        ds.open_images(root, size=SIZE)
    with pytest.warns(SkippedImagesWarning, match=r"1 of 13 image files are not readable images and are left out"):
        folder = ds.open_images(root, size=SIZE, on_error="skip")
    assert [where for where, _ in folder.skipped] == [str(bad)]
    assert reason in folder.skipped[0][1]
    assert folder.files == tuple(str(f) for f in files)
    assert folder.labels.tolist() == [0] * 5 + [1] * 4 + [2] * 3
    assert "1 skipped: bad.jpg (" in folder.summary
    np.testing.assert_array_equal(folder.images.read(), stacked(files))


def test_a_truncated_jpeg_is_found_at_open_with_verify_decode_else_at_its_read(photos):
    root, files = photos
    bad = _truncated_jpeg(root / "cat" / "2b.jpg")  # sorts between cat/2.png and cat/3.jpg: index 3
    with pytest.raises(CorruptSourceError, match=rf"{re.escape(str(bad))}: not a readable image: .*truncated"):
        ds.open_images(root, size=SIZE, verify="decode")
    with pytest.warns(SkippedImagesWarning, match="1 of 13"):
        skipped = ds.open_images(root, size=SIZE, verify="decode", on_error="skip")
    np.testing.assert_array_equal(skipped.images.read(), stacked(files))
    # Its header reads, so a header check lets it in: its read says which file, and never gives zeros.
    folder = ds.open_images(root, size=SIZE)
    assert folder.files[3] == str(bad)
    np.testing.assert_array_equal(folder.images.read((slice(0, 3),)), stacked(files[:3]))
    with pytest.raises(
        CorruptSourceError, match=rf"{re.escape(str(bad))}: cannot be decoded: .*truncated.*verify='decode'"
    ):
        folder.images.read((slice(2, 6),))
    with pytest.raises(CorruptSourceError, match="cannot be decoded"):
        ds.open(folder.images).sum().compute()


def test_pillow_set_to_load_truncated_images_is_refused(photos, monkeypatch):
    # Pillow would fill the missing part of a truncated file with grey: made-up pixels, given as data.
    from PIL import ImageFile

    root, _ = photos
    folder = ds.open_images(root, size=SIZE)
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(InvalidArgumentError, match="LOAD_TRUNCATED_IMAGES is True"):
        ds.open_images(root, size=SIZE)
    with pytest.raises(InvalidArgumentError, match="LOAD_TRUNCATED_IMAGES is True"):
        folder.images.read((slice(0, 2),))


def test_nothing_readable_is_an_error_even_when_skipping(tmp_path):
    (tmp_path / "a.jpg").write_text("no")
    (tmp_path / "b.png").write_text("no")
    with pytest.raises(CorruptSourceError, match=r"none of its 2 image file\(s\) can be read"):
        ds.open_images(tmp_path, size=SIZE, on_error="skip")


def _png_declaring(width: int, height: int) -> bytes:
    """A small valid PNG whose header is changed to declare ``width`` x ``height`` pixels (its CRC made to fit)."""
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    ihdr = bytearray(data[12:29])  # b"IHDR" and its 13 bytes
    ihdr[4:12] = struct.pack(">II", width, height)
    data[12:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)))
    return bytes(data)


def _jpeg_declaring(width: int, height: int) -> bytes:
    """A small valid JPEG whose frame header (SOF0) is changed to declare ``width`` x ``height`` pixels."""
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="JPEG")
    data = bytearray(buffer.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.mark.parametrize(
    "forged", [_png_declaring(100_000, 100_000), _jpeg_declaring(65_000, 65_000)], ids=["png", "jpeg"]
)
def test_a_decompression_bomb_is_refused_before_it_is_decoded(tmp_path, forged):
    # 10 and 4.2 gigapixels: decoding either would take tens of GiB. Refused from the header, in bounded memory.
    (tmp_path / "bomb.png").write_bytes(forged)
    with pytest.raises(CorruptSourceError, match=r"more than max_pixels=89,478,485: .*decompression bomb"):
        ds.open_images(tmp_path, size=SIZE)
    save(tmp_path / "fine.png", photo(20, 20, 0))
    with pytest.warns(SkippedImagesWarning):
        folder = ds.open_images(tmp_path, size=SIZE, on_error="skip")
    assert folder.images.shape[0] == 1


def test_max_pixels_is_the_limit(tmp_path):
    save(tmp_path / "a.png", photo(40, 30, 0))
    with pytest.raises(CorruptSourceError, match=r"declares 40x30 pixels .* more than max_pixels=1,000"):
        ds.open_images(tmp_path, size=SIZE, max_pixels=1000)
    assert ds.open_images(tmp_path, size=SIZE, max_pixels=1200).images.shape[0] == 1


# --- changes on disk ------------------------------------------------------------------------------------------


def test_a_file_changed_after_open_is_detected(photos):
    root, files = photos
    folder = ds.open_images(root, size=SIZE)
    save(files[4], photo(48, 32, 99))  # another picture under the same name
    bump_mtime(files[4])
    np.testing.assert_array_equal(folder.images.read((slice(0, 4),)), stacked(files[:4]))  # the others read
    with pytest.raises(SourceChangedError, match=rf"{re.escape(str(files[4]))} changed on disk after it was opened"):
        folder.images.read((slice(3, 6),))
    files[5].unlink()
    with pytest.raises(SourceRemovedError, match=rf"{re.escape(str(files[5]))} was removed after it was opened"):
        folder.images.read((slice(5, 6),))
    reopened = ds.open_images(root, size=SIZE)
    assert reopened.images.token != folder.images.token
    np.testing.assert_array_equal(reopened.images.read((slice(4, 5),)), stacked(files[4:5]))


def test_a_tar_changed_after_open_is_detected(photos, tmp_path):
    root, _ = photos
    archive = tmp_path / "photos.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname="train")
    folder = ds.open_images(archive, size=SIZE)
    with archive.open("r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(b"\0" * 1024)
    with pytest.raises(SourceChangedError, match="changed on disk after it was opened"):
        folder.images.read((slice(0, 2),))


def test_the_token_is_stable_for_the_same_files_and_arguments(photos):
    root, _ = photos
    first = ds.open_images(root, size=SIZE).images.token
    assert ds.open_images(root, size=SIZE).images.token == first
    assert ds.open_images(root, size=SIZE, resize="crop").images.token != first
    assert ds.open_images(root, size=(32, 32)).images.token != first


# --- with dask, streams and worker processes ----------------------------------------------------------------


def test_ds_open_gives_a_dask_array_of_the_images(photos):
    root, files = photos
    folder = ds.open_images(root, size=SIZE, resize="crop")
    x = ds.open(folder.images)
    assert isinstance(x, da.Array)
    assert x.shape == (12, *SIZE, 3)
    assert x.chunks[1:] == ((SIZE[0],), (SIZE[1],), (3,))  # whole images per block
    expected = stacked(files, resize="crop")
    np.testing.assert_array_equal(x.compute(), expected)
    assert float(x.mean().compute()) == pytest.approx(expected.mean())
    np.testing.assert_array_equal(x[folder.labels == 1].mean(axis=0).compute(), expected[5:9].mean(axis=0))


def test_a_stream_yields_every_image_once_per_epoch(photos):
    root, files = photos
    folder = ds.open_images(root, size=SIZE)
    expected = stacked(files)
    index = {image.tobytes(): i for i, image in enumerate(expected)}
    stream = ds.stream(folder.images, batch_size=8, shuffle=True, seed=0)
    orders = []
    for _ in range(2):
        seen = [index[image.tobytes()] for batch in stream for image in batch]
        assert sorted(seen) == list(range(12))
        orders.append(seen)
    assert len(stream) == 2


def test_a_stream_pairs_images_with_their_labels(photos):
    root, files = photos
    folder = ds.open_images(root, size=SIZE)
    expected = stacked(files)
    index = {image.tobytes(): i for i, image in enumerate(expected)}
    seen = []
    for images, y in ds.stream((folder.images, folder.labels), batch_size=4, shuffle=True, seed=1):
        for image, label in zip(images, y):
            i = index[image.tobytes()]
            assert label == folder.labels[i]
            seen.append(i)
    assert sorted(seen) == list(range(12))


def test_the_source_pickles_without_files_or_threads(photos):
    root, files = photos
    source = ds.open_images(root, size=SIZE, threads=3).images
    helpers_settled()  # those of reads that earlier tests' dropped streams may still be finishing
    source.read((slice(0, 4),))
    assert not helper_threads()  # they end with the read: nothing for a pickle or a fork to carry
    payload = cloudpickle.dumps(source)
    assert len(payload) < 16 * 1024
    clone = pickle.loads(payload)
    assert clone.token == source.token
    np.testing.assert_array_equal(clone.read(), stacked(files))


def test_worker_processes_read_the_images(photos):
    root, files = photos
    folder = ds.open_images(root, size=SIZE)
    with ds.session("processes", progress=False):
        total = ds.open(folder.images).astype("u8").sum().compute()
    assert int(total) == int(stacked(files).astype("u8").sum())


def test_a_plan_keeps_whole_images_together(photos):
    root, _ = photos
    source = ds.open_images(root, size=SIZE).images
    plan = ds.plan(source)
    assert plan.shape == source.shape
    assert plan.chunks[1:] == source.shape[1:]
    assert source.decode_bytes > 0


# --- arguments and paths that cannot be opened --------------------------------------------------------------


@pytest.mark.parametrize(
    "size", [224, (224,), (224, 224, 3), (0, 10), (-1, 10), (2.5, 3), ("224", "224"), (True, 3), "224x224", None]
)
def test_a_size_that_is_not_two_positive_ints_is_refused(photos, size):
    root, _ = photos
    with pytest.raises(InvalidArgumentError, match=r"give the \(height, width\) every image is resized to"):
        ds.open_images(root, size=size)


@pytest.mark.parametrize(
    ("argument", "said"),
    [
        ({"mode": "RGBA"}, "mode='RGBA'"),
        ({"resize": "fit"}, "resize='fit'"),
        ({"on_error": "ignore"}, "on_error='ignore'"),
        ({"verify": "none"}, "verify='none'"),
        ({"threads": 0}, "threads=0"),
        ({"max_pixels": 0}, "max_pixels=0"),
        ({"labels": 3}, "labels=3"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else "",
)
def test_other_bad_arguments_are_refused(photos, argument, said):
    root, _ = photos
    with pytest.raises(InvalidArgumentError, match=said):
        ds.open_images(root, size=SIZE, **argument)


def test_paths_without_images_say_so(tmp_path):
    with pytest.raises(SourceNotFoundError, match=r"nowhere: no such file or directory"):
        ds.open_images(tmp_path / "nowhere", size=SIZE)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceNotFoundError, match=r"empty: no image files"):
        ds.open_images(tmp_path / "empty", size=SIZE)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.txt").write_text("hi")
    with pytest.raises(SourceNotFoundError, match=r"no image files .* found; 1 other file\(s\): README\.txt"):
        ds.open_images(tmp_path / "notes", size=SIZE)
    with pytest.raises(SourceNotFoundError, match="no file matches this pattern"):
        ds.open_images(str(tmp_path / "*" / "*.jpg"), size=SIZE)
    with pytest.raises(SourceNotFoundError, match=r"missing\.jpg"):
        ds.open_images([tmp_path / "missing.jpg"], size=SIZE)
    (tmp_path / "data.bin").write_bytes(b"\1\2\3" * 300)
    with pytest.raises(UnknownFormatError, match="not a folder, a JPEG or PNG image, or a tar file"):
        ds.open_images(tmp_path / "data.bin", size=SIZE)


def test_every_error_is_one_of_ours(tmp_path):
    with pytest.raises(DaskstreamError):
        ds.open_images(tmp_path / "nowhere", size=SIZE)
    with pytest.raises(FileNotFoundError):  # and the builtin a Python user expects
        ds.open_images(tmp_path / "nowhere", size=SIZE)


def test_without_pillow_it_says_what_to_install(tmp_path):
    save(tmp_path / "a.png", photo(10, 10, 0))
    code = (
        "import sys\n"
        "sys.modules['PIL'] = None\n"  # as where Pillow is not installed
        "import daskstream as ds\n"
        "from daskstream.errors import MissingDependencyError\n"
        "try:\n"
        f"    ds.open_images({str(tmp_path)!r}, size=(8, 8))\n"
        "except MissingDependencyError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "open_images needs" in done.stdout
    assert "pip install 'daskstream[images]'" in done.stdout


# --- how it reads ---------------------------------------------------------------------------------------------


def test_summary_and_repr_say_the_counts(photos):
    root, _ = photos
    folder = ds.open_images(root, size=SIZE, resize="crop")
    assert folder.summary == "12 images in 3 classes, 32x48 RGB, crop"
    text = repr(folder)
    assert text.startswith(f"<daskstream ImageFolder {str(root)!r}")
    assert "classes: cat, dog, fox" in text
    assert "shape=(12, 32, 48, 3)" in text
    assert "ImageFolder" in folder._repr_html_()
    assert "12 JPEG/PNG files, decoded to 32x48 RGB, crop" in repr(folder.images)


def test_a_failing_decode_stops_the_other_threads_and_is_raised():
    done = []
    lock = threading.Lock()

    def work(i):
        if i == 3:
            raise ValueError("image 3")
        with lock:
            done.append(i)

    with pytest.raises(ValueError, match="image 3"):
        run_parallel(1000, work, threads=4)
    assert len(done) < 1000
    assert not helper_threads()
    # Every helper was counted back: a later call gets one again (the first two items meet in two threads).
    meeting = threading.Barrier(2, timeout=30)
    run_parallel(2, lambda i: meeting.wait(), threads=2)


def helper_threads():
    return [t for t in threading.enumerate() if t.name == "daskstream-images"]


def helpers_settled() -> None:
    gc.collect()
    deadline = time.monotonic() + 10
    while helper_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
