"""A folder (or pattern, list or tar file) of JPEG and PNG images as one array of shape (N, H, W, C), uint8.

:func:`open_images` finds the files (:mod:`daskstream.sources.images.files`),
checks each one's header in parallel, labels them from their class folders
or a CSV file (:mod:`daskstream.sources.images.labels`) and returns an
:class:`ImageFolder`, whose ``images`` is a :class:`~daskstream.Source`: every
read decodes and resizes the images it spans (:mod:`daskstream.sources.images.codec`)
on the reading thread and up to ``threads - 1`` helper threads this process
shares among its reads (:mod:`daskstream.sources.images.reads`). Pillow
releases the GIL while it decodes and resamples, so the threads decode side
by side. A source holds the files' names and stamps and the decoding
arguments, never a file or a thread pool, so it sits in dask graphs and
travels to worker processes as the other sources do.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from dask.system import cpu_count

from daskstream.advice import keyword, said
from daskstream.display import card, table
from daskstream.errors import (
    CorruptSourceError,
    InvalidArgumentError,
    SkippedImagesWarning,
    SourceChangedError,
    warn,
)
from daskstream.files import open_regular
from daskstream.planning.budget import format_size
from daskstream.sources.base import Region, Source, file_stamp, listing, now_ns
from daskstream.sources.images.codec import (
    DEFAULT_MAX_PIXELS,
    BadImage,
    DecodeSpec,
    Header,
    decode_into,
    read_header,
    require_pillow,
)
from daskstream.sources.images.files import Found, candidate, find_images
from daskstream.sources.images.labels import Labels, csv_labels, folder_labels
from daskstream.sources.images.reads import FolderFiles, TarMembers, run_parallel
from daskstream.sources.tokens import source_token

ON_ERROR = ("raise", "skip")
VERIFY = ("header", "decode")
# Decoding threads when none are asked for: the CPUs this process may use, at most this many (more
# seldom pays: a read's images are few, and its callers -- dask's threads, a stream's -- run reads at once).
_MOST_DEFAULT_THREADS = 8
# Skipped files named in a one-line summary.
_SUMMARY_SKIPPED = 3


def open_images(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    size: tuple[int, int],
    labels: str | os.PathLike[str] | None = "folders",
    mode: str = "RGB",
    resize: str = "stretch",
    on_error: str = "raise",
    verify: str = "header",
    exif_orientation: bool = True,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    threads: int | None = None,
    quality: str = "accurate",
) -> ImageFolder:
    """Open JPEG and PNG images as one array of shape ``(N, height, width, channels)``, uint8, decoded as read.

    Parameters
    ----------
    path
        A folder (walked recursively: ``photos/cat/1.jpg``), a pattern
        (``"photos/**/*.jpg"``), a list of files, one image, or a tar file of
        images (plain ``.tar``; a compressed one is refused with the command
        that decompresses it). In a folder, pattern or tar, files named
        ``.jpg``, ``.jpeg``, ``.jpe``, ``.jfif`` or ``.png`` (any case) are
        the images; other files (``README.txt``, ``labels.csv``) and names
        starting with ``.`` (``.DS_Store``, ``.ipynb_checkpoints``) are left
        out. Listed files are all taken. Each file's format is told by its
        first bytes, not its name. Folders, patterns and tars are sorted by
        path (folder by folder); a list keeps its order.
    size
        ``(height, width)`` every image becomes.
    labels
        ``"folders"`` (default): each image's class is its first folder below
        ``path`` (classes sorted by name, numbered from 0, as torchvision's
        ``ImageFolder``); a folder whose images all lie in it directly is
        unlabelled. A path to a CSV file: a header row, a column of file
        names (``file``, ``filename``, ``path``, ``image``, ``id``...) and
        one of labels (``label``, ``class``, ``category``, ``target``); names
        are paths below ``path`` or file names, with or without extension;
        whole-number labels are the labels, others class names (sorted,
        numbered from 0). See :mod:`daskstream.sources.images.labels`.
        ``None``: unlabelled.
    mode
        ``"RGB"`` (3 channels) or ``"L"`` (greyscale, 1 channel). Other
        modes are converted as Pillow's ``convert`` does (alpha dropped,
        CMYK and palettes to RGB); 16-bit greyscale PNGs keep their top 8 bits.
    resize
        How an image of another shape becomes ``size``: ``"stretch"`` (the
        whole image, its aspect ratio not kept), ``"crop"`` (scaled to cover
        ``size``, the overhang cut off equally on both sides: a centre crop)
        or ``"pad"`` (scaled to fit inside ``size``, centred, the margins
        zeros). Resampling is Pillow's bilinear filter, antialiased when it
        shrinks; JPEGs are first decoded at 1/2, 1/4 or 1/8 scale where the
        result still has at least the pixels the resample needs (libjpeg's
        scaled decoding, which is as good and up to several times faster).
    on_error
        ``"raise"`` (default): a file that is not a readable JPEG or PNG is a
        :class:`~daskstream.errors.CorruptSourceError` naming every such file
        and why. ``"skip"``: they are left out, listed in
        :attr:`ImageFolder.skipped` with why, and a
        :class:`~daskstream.errors.SkippedImagesWarning` gives their count.
    verify
        What is checked of each file at open: ``"header"`` (default): that it
        is a JPEG or PNG whose header parses, of at most ``max_pixels``;
        ``"decode"``: also that it decodes (a truncated file is found now,
        not while a computation runs; costs a full decode of every file).
        A file that fails at a read anyway (damaged past its header, or
        changed) raises an error naming it, never gives zeros.
    exif_orientation
        Turn each image upright as its EXIF orientation says (as viewers show
        photos); ``False`` gives the pixels as stored, as Pillow's
        ``Image.open`` and torchvision's loader do.
    max_pixels
        The most pixels a file's header may declare (default Pillow's
        decompression-bomb limit, about 89 million): a larger one is refused
        before it is decoded, as damaged or forged.
    threads
        Threads that decode the images of one read (the reading thread and
        helpers this process shares between reads); default the CPUs this
        process may use, at most 8. Also the threads that check the files at
        open.
    quality
        ``"accurate"`` (default): as ``resize`` says, JPEGs decoded with at
        least the pixels the resample needs. ``"fast"``: JPEGs may be decoded
        at a scale with down to half the target's pixels in each direction,
        which the bilinear resample then stretches: fewer pixels decoded and
        resampled (1.3 to 1.6 times the images a second of the accurate path
        on photos 2 to 4 times the target's size, and 1.03 to 1.18 times
        tf.data's default pipeline; ``benchmarks/images.py``), detail finer
        than half the target's resolution lost, much as tf.data's default
        resize (bilinear, no antialiasing) loses it to aliasing, though less
        (a PSNR against a Lanczos resize of the full image of 44 to 49 dB,
        where tf.data's gives 39 to 41 and the accurate path 50 to 52). PNGs
        are decoded whole either way.

    Returns
    -------
    ImageFolder
        ``images`` (the :class:`~daskstream.Source`: ``ds.open(folder.images)``
        is a dask array, ``ds.stream(folder.images, ...)`` streams batches),
        ``labels``, ``classes``, ``files``, ``skipped``.

    Raises
    ------
    SourceNotFoundError
        For a path that does not exist, a pattern nothing matches, or a folder
        or tar without images.
    CorruptSourceError
        For unreadable files (``on_error="raise"``), or when none is readable.
    InvalidArgumentError
        For a ``size`` that is not two positive ints, another bad argument,
        or labels that do not fit the images.
    MissingDependencyError
        Without Pillow: ``pip install 'daskstream[images]'``.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from PIL import Image
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for name, colour in [("cat/1.png", "red"), ("cat/2.png", "red"), ("dog/1.jpg", "blue")]:
    ...     (root / name).parent.mkdir(exist_ok=True)
    ...     Image.new("RGB", (40, 30), colour).save(root / name)
    >>> folder = open_images(root, size=(16, 16))
    >>> folder.summary
    '3 images in 2 classes, 16x16 RGB, stretch'
    >>> folder.images.shape, folder.labels.tolist(), folder.classes
    ((3, 16, 16, 3), [0, 0, 1], ('cat', 'dog'))
    >>> folder.images[0][0, 0].tolist()
    [255, 0, 0]
    """
    spec = DecodeSpec.checked(size, mode, resize, exif_orientation, max_pixels, quality)
    if on_error not in ON_ERROR:
        raise InvalidArgumentError(f"on_error={on_error!r}: use 'raise' or 'skip'")
    if verify not in VERIFY:
        raise InvalidArgumentError(f"verify={verify!r}: use 'header' (check each file's header) or 'decode'")
    if labels is not None and not isinstance(labels, str | os.PathLike):
        raise InvalidArgumentError(f"labels={labels!r}: use 'folders', the path of a CSV file, or None")
    threads = _checked_threads(threads)
    require_pillow()  # before the files are listed: a missing (or truncation-tolerant) Pillow is said at once
    found = find_images(path)
    tar_stamp = file_stamp(found.root) if found.kind == "tar" else None
    examined = _examine(found, spec, verify, threads)
    if tar_stamp is not None and file_stamp(found.root) != tar_stamp:
        raise SourceChangedError(f"{found.root} changed on disk while its images were checked; open it again")
    kept = [i for i, (_, header, _) in enumerate(examined) if header is not None]
    skipped = [(found.where(i), reason) for i, (_, _, reason) in enumerate(examined) if reason is not None]
    _refuse_or_warn(found, skipped, kept, on_error)
    files: FolderFiles | TarMembers
    if tar_stamp is not None:
        files = TarMembers(
            found.root, [found.names[i] for i in kept], [found.offsets[i] for i in kept],
            [found.sizes[i] for i in kept], tar_stamp,
        )  # fmt: skip
    else:
        stamps = np.array([examined[i][0] for i in kept], dtype=np.int64)
        files = FolderFiles(found.root, [found.names[i] for i in kept], stamps)
    label_names = [found.label_names[i] for i in kept]
    if labels is None:
        labelled = Labels(None, ())
    elif isinstance(labels, str) and labels == "folders":
        labelled = folder_labels(label_names, found.root)
    else:
        labelled = csv_labels(os.fspath(labels), label_names, found.root)
    working = max(header.working_bytes for _, header, _ in examined if header is not None)
    source = ImageSource(files, spec, threads=threads, working_bytes=working)
    return ImageFolder(source, labelled, skipped)


def _checked_threads(threads: Any) -> int:
    if threads is None:
        # dask's count of the usable CPUs: affinity and cgroup quota counted.
        return max(1, min(cpu_count(), _MOST_DEFAULT_THREADS))
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise InvalidArgumentError(said(keyword("threads", threads), ": give a positive number of threads, or None"))
    return threads


Examined = tuple[tuple[int, ...] | None, Header | None, str | None]


def _examine(found: Found, spec: DecodeSpec, verify: str, threads: int) -> list[Examined]:
    """Each candidate's stamp and header, or why it is not a readable image: checked ``threads`` at a time."""
    results: list[Examined] = [(None, None, None)] * len(found.names)

    def check(i: int, shared: Any) -> None:
        if i in found.problems:
            results[i] = (None, None, found.problems[i])
            return
        try:
            with candidate(found, i, shared) as (fp, stamp):
                header = read_header(fp, spec)
                if verify == "decode":
                    fp.seek(0)
                    decode_into(fp.read(), _blank(spec), spec)
        except BadImage as exc:
            results[i] = (None, None, exc.reason)
            return
        except FileNotFoundError:
            results[i] = (None, None, "it cannot be opened: a broken link, or removed since it was listed")
            return
        except OSError as exc:  # our errors too: a permission denied, a pipe named like an image...
            results[i] = (None, None, f"it cannot be read ({exc.strerror or exc})")
            return
        results[i] = (stamp, header, None)

    with _shared_handle(found) as shared:
        run_parallel(len(found.names), lambda i: check(i, shared), threads)
    return results


@contextlib.contextmanager
def _shared_handle(found: Found) -> Any:
    if found.kind != "tar":
        yield None
        return
    with open_regular(found.root) as f:
        yield f.fileno()


def _blank(spec: DecodeSpec) -> np.ndarray:
    return np.zeros((*spec.size, spec.channels), dtype=np.uint8)


def _refuse_or_warn(found: Found, skipped: list[tuple[str, str]], kept: list[int], on_error: str) -> None:
    """Refuse unreadable files (``on_error="raise"``, or when none is readable), or say they are left out."""
    if not skipped:
        return
    total = len(found.names)
    named = listing([f"{where} ({reason})" for where, reason in skipped], limit=10)
    if not kept:
        raise CorruptSourceError(
            f"{found.root}: none of its {total} image file(s) can be read: {named}; check that these are JPEG or "
            "PNG images"
        )
    if on_error == "raise":
        if len(skipped) == 1:
            where, reason = skipped[0]
            raise CorruptSourceError(
                f"{where}: not a readable image: {reason}; remove or repair it, or pass on_error='skip' to leave "
                "unreadable files out"
            )
        raise CorruptSourceError(
            f"{found.root}: {len(skipped)} of {total} image files are not readable images: {named}; remove or repair "
            "them, or pass on_error='skip' to leave them out"
        )
    warn(
        f"{found.root}: {len(skipped)} of {total} image files are not readable images and are left out "
        f"(ImageFolder.skipped says why): {listing([where for where, _ in skipped], limit=5)}",
        SkippedImagesWarning,
    )


class ImageSource(Source):
    """JPEG and PNG files as an array of shape ``(N, height, width, channels)``, uint8, decoded as read.

    Made by :func:`open_images`. Each image is one storage chunk, so planned
    chunks and stream shards hold whole images. A read decodes the images it
    spans on the reading thread and up to ``threads - 1`` helper threads of
    this process, each reading one file at a time and decoding it straight
    into the result. Each file read is checked against what it was when
    opened (a tar file as a whole at every read): a changed or removed file
    is a :class:`~daskstream.errors.SourceChangedError` naming it, and one that
    no longer decodes a :class:`~daskstream.errors.CorruptSourceError`
    naming it.

    Attributes
    ----------
    files
        The files' table (names, stamps; a tar's offsets).
    spec
        What every image becomes (size, mode, resize policy...).
    threads
        Threads that decode the images of one read.
    """

    format = "images"

    def __init__(self, files: FolderFiles | TarMembers, spec: DecodeSpec, *, threads: int, working_bytes: int) -> None:
        self.files = files
        self.spec = spec
        self.threads = threads
        self.working_bytes = working_bytes
        self.path = files.root
        self.dataset = None
        self.opened_ns = now_ns()
        height, width = spec.size
        self.shape = (len(files), height, width, spec.channels)
        self.dtype = np.dtype(np.uint8)
        self.storage_chunks = (1, height, width, spec.channels)
        self.layout = "chunked"
        self.stamp = files.stamp()
        self.token = source_token(
            self.format, self.path, files.token_parts().hex(), spec.size, spec.mode, spec.resize, spec.exif_orientation
        )

    def current_stamp(self) -> tuple[Any, ...] | None:
        # A tar file as a whole; the files of a folder one by one as they are read (see FolderFiles).
        return None if self.stamp is None else file_stamp(self.path)

    @property
    def decode_bytes(self) -> int:
        """What a read holds beside its result: per decoding thread, the largest file and its decoded frames."""
        return self.threads * (self.files.largest + self.working_bytes)

    def describe_storage(self) -> str:
        what = f"{len(self.files):,} JPEG/PNG files" + (" in a tar file" if isinstance(self.files, TarMembers) else "")
        return f"{what}, decoded to {self.spec.describe()}"

    def _read_box(self, box: Region) -> np.ndarray:
        rows = range(box[0].start, box[0].stop)
        inner = box[1:]
        whole = all(s.start == 0 and s.stop == n for s, n in zip(inner, self.shape[1:]))
        # Padding is the zeros the image is not decoded over.
        blank = np.zeros if self.spec.resize == "pad" else np.empty
        if whole:
            out = blank((len(rows), *self.shape[1:]), dtype=self.dtype)
        else:
            out = np.empty((len(rows), *(s.stop - s.start for s in inner)), dtype=self.dtype)

        with self.files.reading() as shared:

            def decode(k: int) -> None:
                target = out[k] if whole else blank(self.shape[1:], dtype=self.dtype)
                self._decode(rows[k], target, shared)
                if not whole:
                    out[k] = target[inner]

            run_parallel(len(rows), decode, self.threads)
        return out

    def _decode(self, i: int, target: np.ndarray, shared: Any) -> None:
        data = self.files.read(i, shared)
        try:
            decode_into(data, target, self.spec)
        except BadImage as exc:
            raise CorruptSourceError(
                f"{self.files.where(i)}: cannot be decoded: {exc.reason}. Its header was readable when the images "
                "were opened (open_images checks headers; verify='decode' decodes every file), so it is damaged "
                "past its header: repair or remove it and open the images again, or open them with "
                "on_error='skip', verify='decode' to leave such files out"
            ) from None


class ImageFolder:
    """Images opened by :func:`open_images`: the array, the labels, and what was left out.

    Attributes
    ----------
    images
        An :class:`ImageSource` of shape ``(N, height, width, channels)``,
        uint8: ``ds.open(folder.images)`` is a dask array of it,
        ``ds.stream(folder.images, ...)`` streams batches of it.
    labels
        int64 array of shape ``(N,)``, the class of each image, or ``None``.
    classes
        The class names, ``classes[label]`` naming ``label`` (empty when unlabelled).
    files
        Each image's file, in the array's order (``archive.tar::member`` in a tar).
    skipped
        ``(file, reason)`` for each file left out (``on_error="skip"``).
    """

    def __init__(self, images: ImageSource, labels: Labels, skipped: list[tuple[str, str]]) -> None:
        self.images = images
        self.labels = labels.values
        self.classes = labels.classes
        self.files = tuple(images.files.where(i) for i in range(len(images.files)))
        self.skipped = list(skipped)

    def __len__(self) -> int:
        return len(self.files)

    @property
    def summary(self) -> str:
        """One line: the counts of images, classes and files skipped, and what each image became.

        ``"1,204 images in 3 classes, 224x224 RGB, crop, 2 skipped: a.jpg (the file is empty), ..."``
        """
        n = len(self.files)
        count = f"{n:,} image{'s' if n != 1 else ''}"
        if self.labels is None:
            line = f"{count}, unlabelled"
        else:
            line = f"{count} in {len(self.classes):,} class{'es' if len(self.classes) != 1 else ''}"
        line += f", {self.images.spec.describe()}"
        if self.skipped:
            shown = [f"{os.path.basename(where)} ({reason.split(';')[0]})" for where, reason in self.skipped]
            line += f", {len(self.skipped):,} skipped: {listing(shown, limit=_SUMMARY_SKIPPED)}"
        return line

    def __repr__(self) -> str:
        classes = listing(list(self.classes), limit=8)
        lines = [
            f"<daskstream ImageFolder {self.images.path!r}",
            f"  {self.summary}",
            f"  images: shape={self.images.shape} dtype=uint8 ({format_size(self.images.nbytes)} decoded)",
        ]
        if self.classes:
            lines.append(f"  classes: {classes}")
        return "\n".join(lines) + ">"

    def _repr_html_(self) -> str:
        rows = [
            ("images", f"{len(self.files):,}"),
            ("shape", self.images.shape),
            ("decoded", f"{self.images.spec.describe()}, {format_size(self.images.nbytes)}"),
            ("classes", listing(list(self.classes), limit=20, empty="none (unlabelled)")),
            ("skipped", listing([f"{w} ({r})" for w, r in self.skipped], limit=10, empty="none")),
        ]
        return card("daskstream ImageFolder", table(rows), caption=self.images.path)


__all__ = ["ImageFolder", "ImageSource", "open_images"]
