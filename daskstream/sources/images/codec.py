"""One JPEG or PNG file to one array of the training size: the check at open and the decode at read, with Pillow.

Pillow was measured against simplejpeg and imagecodecs (``benchmarks/images.py``):
all three decode with libjpeg-turbo and release the GIL while they decode and
resample, so two threads decode about twice as fast as one; Pillow with
``Image.draft`` (libjpeg's scaled decoding) was as fast as the fastest for
photos twice the target size or more, at the same quality, and it is the one
library needed for PNG and for the resample anyway.

A file is opened by its first bytes, never its extension, with Pillow's JPEG
or PNG reader directly: ``Image.open`` would try every format Pillow knows,
and it checks the size against ``PIL.Image.MAX_IMAGE_PIXELS`` by a warning
below twice that limit. Here the size the header declares is checked against
``max_pixels`` before a pixel is decoded, and one too large is refused, which
bounds the memory a forged header can claim (a decompression bomb).
"""

from __future__ import annotations

import functools
import io
import struct
import zlib
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from daskstream.advice import keyword, said
from daskstream.dependencies import optional_import
from daskstream.errors import InvalidArgumentError
from daskstream.planning.budget import format_size
from daskstream.planning.resize import QUALITIES, check_resize_policy, decode_at_least, plan_resize

JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Formats recognised by their first bytes only to say what they are when refused.
_OTHER_FORMATS = {
    b"GIF87a": "a GIF image",
    b"GIF89a": "a GIF image",
    b"BM": "a BMP image",
    b"II*\x00": "a TIFF image",
    b"MM\x00*": "a TIFF image",
    b"\x00\x00\x00\x0cjP  ": "a JPEG 2000 image",
    b"%PDF": "a PDF document",
}
_CONVERT = "convert it to JPEG or PNG, or leave it out"

#: Channels of each output mode.
MODES = {"RGB": 3, "L": 1}
#: The images ``open_images`` reads whole by default: Pillow's own decompression-bomb limit
#: (``PIL.Image.MAX_IMAGE_PIXELS``), about 0.25 GiB of RGB.
DEFAULT_MAX_PIXELS = 89_478_485
# Bytes a decode holds per pixel of the decoded image, at most: the decoder's frame (up to 4
# bytes a pixel, 8 for 16-bit colour with alpha) and a converted and a rotated copy (3 each).
_WORKING_BYTES_PER_PIXEL = 14

# EXIF orientation (tag 0x0112) -> the transpose that shows the image upright; 5 to 8 swap the axes.
_ORIENTATION_TAG = 0x0112
_TRANSPOSES = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE", 6: "ROTATE_270",
               7: "TRANSVERSE", 8: "ROTATE_90"}  # fmt: skip
_SWAPS_AXES = frozenset({5, 6, 7, 8})
# Pillow's modes for 16-bit greyscale: its convert() clips them to 8 bits (everything above 255 white).
_SIXTEEN_BIT = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})


class BadImage(Exception):
    """A file that is not a readable JPEG or PNG image, with the reason (for a skip list or an error)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class DecodeSpec:
    """What every image becomes: the arguments of :func:`daskstream.open_images` that decoding takes.

    Attributes
    ----------
    size
        ``(height, width)`` of every image.
    mode
        ``"RGB"`` or ``"L"`` (greyscale).
    resize
        ``"stretch"``, ``"crop"`` or ``"pad"`` (see :func:`daskstream.planning.resize.plan_resize`).
    exif_orientation
        Whether images are turned upright as their EXIF orientation says.
    max_pixels
        The largest ``width * height`` a file's header may declare.
    quality
        ``"accurate"`` or ``"fast"``: how far a JPEG's scaled decoding may go
        (:func:`~daskstream.planning.resize.decode_at_least`).
    """

    size: tuple[int, int]
    mode: str
    resize: str
    exif_orientation: bool
    max_pixels: int
    quality: str = "accurate"

    @classmethod
    def checked(
        cls, size: Any, mode: Any, resize: Any, exif_orientation: Any, max_pixels: Any, quality: Any = "accurate"
    ) -> DecodeSpec:
        """The spec of these arguments, each checked, or an :class:`InvalidArgumentError` naming the one that is not."""
        if (
            not isinstance(size, tuple | list)
            or len(size) != 2
            or not all(isinstance(n, int | np.integer) and not isinstance(n, bool) and n > 0 for n in size)
        ):
            raise InvalidArgumentError(
                said(
                    keyword("size", size),
                    ": give the (height, width) every image is resized to, two positive ints, e.g. ",
                    keyword("size", (224, 224)),
                )
            )
        if mode not in MODES:
            raise InvalidArgumentError(f"mode={mode!r}: use 'RGB' (3 channels) or 'L' (greyscale, 1 channel)")
        if not isinstance(resize, str):
            raise InvalidArgumentError(f"resize={resize!r}: use 'stretch', 'crop' or 'pad'")
        check_resize_policy(resize)
        if not isinstance(exif_orientation, bool):
            raise InvalidArgumentError(f"exif_orientation={exif_orientation!r}: use True or False")
        if not isinstance(max_pixels, int) or isinstance(max_pixels, bool) or max_pixels <= 0:
            raise InvalidArgumentError(f"max_pixels={max_pixels!r}: give a positive number of pixels")
        if not isinstance(quality, str) or quality not in QUALITIES:
            raise InvalidArgumentError(
                said(keyword("quality", quality), ": use 'accurate' (the default) or 'fast' (JPEGs decoded smaller)")
            )
        return cls((int(size[0]), int(size[1])), mode, resize, exif_orientation, max_pixels, quality)

    @property
    def channels(self) -> int:
        return MODES[self.mode]

    def describe(self) -> str:
        """``"224x224 RGB, crop"`` (``", fast"`` after it for the fast decode)."""
        fast = ", fast" if self.quality == "fast" else ""
        return f"{self.size[0]}x{self.size[1]} {self.mode}, {self.resize}{fast}"


@dataclass(frozen=True)
class Header:
    """What a file's header says: enough to check it and to bound the memory its decode takes."""

    format: str
    width: int
    height: int
    mode: str

    @property
    def working_bytes(self) -> int:
        """Bytes a decode of this image holds at most beside its result (the decoded frame and its copies)."""
        return self.width * self.height * _WORKING_BYTES_PER_PIXEL


@functools.cache
def _pillow() -> Any:
    """Pillow's Image module, or what to install (a MissingDependencyError)."""
    return optional_import("PIL.Image", package="Pillow", needed_for="open_images", extra="images")


def require_pillow() -> None:
    """Import Pillow, or raise a :class:`~daskstream.errors.MissingDependencyError` saying what to install.

    Also refuses to decode while ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` is
    set: Pillow then decodes a truncated file into an image whose missing part
    is grey, made-up pixels a training loop cannot tell from data.
    """
    _pillow()
    if _image_file().LOAD_TRUNCATED_IMAGES:
        raise InvalidArgumentError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is True in this process: Pillow then decodes a truncated file into "
            "an image whose missing part is grey, which daskstream does not pass off as data; set it back to False, "
            "and open the images with on_error='skip', verify='decode' to leave truncated files out"
        )


@functools.cache
def _image_file() -> Any:
    return optional_import("PIL.ImageFile", package="Pillow", needed_for="open_images", extra="images")


@functools.cache
def _readers() -> dict[str, Any]:
    """Pillow's JPEG and PNG readers, by format."""
    jpeg = optional_import("PIL.JpegImagePlugin", package="Pillow", needed_for="open_images", extra="images")
    png = optional_import("PIL.PngImagePlugin", package="Pillow", needed_for="open_images", extra="images")
    return {"JPEG": jpeg.JpegImageFile, "PNG": png.PngImageFile}


def pillow_errors() -> tuple[type[BaseException], ...]:
    """What Pillow raises for data it cannot read (its readers raise SyntaxError for a bad header)."""
    image = _pillow()
    return (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error, image.DecompressionBombError)


def sniff(head: bytes) -> str:
    """``"JPEG"`` or ``"PNG"`` from a file's first bytes, else :class:`BadImage` saying what the file is.

    >>> sniff(PNG_MAGIC + b"....")
    'PNG'
    >>> sniff(b"GIF89a..")
    Traceback (most recent call last):
    ...
    daskstream.sources.images.codec.BadImage: a GIF image, not JPEG or PNG; convert it to JPEG or PNG, or leave it out
    """
    if head.startswith(JPEG_MAGIC):
        return "JPEG"
    if head.startswith(PNG_MAGIC):
        return "PNG"
    if not head:
        raise BadImage("the file is empty")
    for magic, what in _OTHER_FORMATS.items():
        if head.startswith(magic):
            raise BadImage(f"{what}, not JPEG or PNG; {_CONVERT}")
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        raise BadImage(f"a WebP image, not JPEG or PNG; {_CONVERT}")
    raise BadImage(f"not a JPEG or PNG image (its first bytes are {head[:16]!r}); {_CONVERT}")


def _opened(fp: IO[bytes]) -> Any:
    """The Pillow image of ``fp`` (a JPEG or PNG file read from its start), its header read and checked."""
    kind = sniff(fp.read(len(PNG_MAGIC)))
    fp.seek(0)
    reader = _readers()[kind]
    try:
        # The format's own reader, not Image.open: see the module's notes on the size limit.
        return reader(fp)
    except pillow_errors() as exc:
        raise BadImage(f"its {kind} header cannot be read ({_said(exc)})") from None


def _checked_size(opened: Any, max_pixels: int) -> None:
    width, height = opened.size
    if width <= 0 or height <= 0:
        raise BadImage(f"its header declares {width}x{height} pixels; the file is damaged")
    if width * height > max_pixels:
        raise BadImage(
            f"its header declares {width}x{height} pixels ({width * height / 1e6:.1f} million, "
            f"{format_size(width * height * 3)} decoded), more than max_pixels={max_pixels:,}: a damaged or "
            "forged file (a decompression bomb), or an image larger than expected; pass a larger max_pixels= "
            "if it is genuine"
        )


def read_header(fp: IO[bytes], spec: DecodeSpec) -> Header:
    """Check the image ``fp`` reads from its start: a JPEG or PNG whose header parses, within ``spec.max_pixels``.

    Reads the header only (Pillow's readers stop at the first pixel data).

    Raises
    ------
    BadImage
        Saying why the file is not a readable image.
    """
    opened = _opened(fp)
    _checked_size(opened, spec.max_pixels)
    return Header(opened.format, opened.size[0], opened.size[1], opened.mode)


def decode_into(data: bytes, out: np.ndarray, spec: DecodeSpec) -> None:
    """Decode the JPEG or PNG file ``data`` into ``out``, an array of ``spec.size + (channels,)``, as ``spec`` says.

    JPEG files are decoded at the smallest of 1/8, 1/4, 1/2 and full scale
    that keeps at least the pixels the resample needs (half of them in each
    direction for ``spec.quality == "fast"``:
    :func:`~daskstream.planning.resize.decode_at_least`), then resampled
    with Pillow's bilinear filter, which is antialiased when it shrinks (its
    support widens with the scale, so every source pixel counts). For
    ``"pad"``, ``out`` must hold zeros: only the image's part is written.

    Raises
    ------
    BadImage
        Saying why the file cannot be decoded (truncated, damaged, too large).
    """
    require_pillow()
    image = _pillow()
    fp = io.BytesIO(data)
    opened = _opened(fp)
    _checked_size(opened, spec.max_pixels)
    jpeg = opened.format == "JPEG"
    try:
        orientation = _orientation(opened) if spec.exif_orientation and jpeg else 1
        if jpeg:
            width, height = opened.size
            if orientation in _SWAPS_AXES:
                width, height = height, width
            want_w, want_h = decode_at_least(width, height, spec.size, spec.resize, spec.quality)
            # The request is in the file's own frame, before the turn upright.
            opened.draft(spec.mode, (want_h, want_w) if orientation in _SWAPS_AXES else (want_w, want_h))
        opened.load()
        if spec.exif_orientation and not jpeg:
            orientation = _orientation(opened)  # a PNG's eXIf chunk may follow its pixels: read after load
        picture = _in_mode(opened, spec.mode)
    except pillow_errors() as exc:
        raise BadImage(f"its {opened.format} data cannot be decoded ({_said(exc)})") from None
    if orientation in _TRANSPOSES:
        picture = picture.transpose(getattr(image.Transpose, _TRANSPOSES[orientation]))
    plan = plan_resize(picture.width, picture.height, spec.size, spec.resize)
    resized = picture.resize(plan.size, image.Resampling.BILINEAR, box=plan.box)
    x, y = plan.offset
    width, height = plan.size
    out[y : y + height, x : x + width] = np.asarray(resized).reshape(height, width, spec.channels)


def _in_mode(picture: Any, mode: str) -> Any:
    """``picture`` in ``mode``; 16-bit greyscale scaled to 8 bits (its top byte) rather than clipped as Pillow's convert does."""
    if picture.mode in _SIXTEEN_BIT:
        image = _pillow()
        wide = np.asarray(picture)
        picture = image.fromarray((np.clip(wide, 0, 65535) >> 8).astype(np.uint8))  # 2-D uint8: mode "L"
    return picture if picture.mode == mode else picture.convert(mode)


def _orientation(opened: Any) -> int:
    """The EXIF orientation (1 to 8), 1 when there is none or it cannot be read."""
    try:
        value = opened.getexif().get(_ORIENTATION_TAG, 1)
    except pillow_errors():
        # A damaged EXIF block does not damage the pixels: such an image is shown as stored, as viewers do.
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _said(exc: BaseException) -> str:
    """An exception of Pillow's as a short phrase."""
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


__all__ = [
    "DEFAULT_MAX_PIXELS",
    "MODES",
    "BadImage",
    "DecodeSpec",
    "Header",
    "decode_into",
    "pillow_errors",
    "read_header",
    "require_pillow",
    "sniff",
]
