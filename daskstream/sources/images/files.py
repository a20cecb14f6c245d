"""Where the images of :func:`daskstream.open_images` are: a folder, a pattern, a list of files, or a tar file.

Finding them (:func:`find_images`) lists candidates by name: in a folder (walked
recursively, symbolic links followed once) or a pattern's matches, files named
``.jpg``, ``.jpeg``, ``.jpe``, ``.jfif`` or ``.png`` (any case); names starting
with ``.`` are left out, files and folders alike (``.DS_Store``, macOS's
``._photo.jpg`` companions, ``.ipynb_checkpoints``), and so is every other
file (``README.txt``, ``labels.csv``). Files listed one by one are all
candidates. Whether a candidate is an image is its first bytes' to say, not its
name's: that is checked when the images are opened.

A tar file's members are indexed once, by :mod:`tarfile`, into their names,
byte offsets and sizes; reads then take each member's bytes with one
``os.pread`` at its offset (:class:`~daskstream.sources.images.reads.TarMembers`),
from any number of threads at once, with no tar object in the read path. A
compressed tar (``.tar.gz``...) cannot be read so (a member's bytes are not at
any offset of the file) and is refused with the command that decompresses it.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import stat
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from daskstream.errors import (
    CorruptSourceError,
    InvalidArgumentError,
    SourceNotFoundError,
    SourcePermissionError,
    UnknownFormatError,
)
from daskstream.files import open_regular
from daskstream.sources.base import checked_path, file_stamp, listing
from daskstream.sources.images.codec import JPEG_MAGIC, PNG_MAGIC
from daskstream.sources.images.reads import Window, stamp_of

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png"})
_GLOB_CHARACTERS = frozenset("*?[")
# Compressed files by their first bytes: the compression, and the command that undoes it in place.
_COMPRESSIONS = {
    b"\x1f\x8b": ("gzip", "gunzip -k"),
    b"BZh": ("bzip2", "bunzip2 -k"),
    b"\xfd7zXZ\x00": ("xz", "unxz -k"),
    b"\x28\xb5\x2f\xfd": ("zstd", "unzstd"),
}


@dataclass
class Found:
    """The candidates a path names, before their bytes are checked.

    Attributes
    ----------
    kind
        ``"folder"``, ``"pattern"``, ``"list"`` or ``"tar"``.
    root
        The folder the names are relative to, or the tar file.
    names
        Each candidate's name: its path relative to ``root`` (``/``-separated),
        or its member name in the tar.
    label_names
        Each candidate's path below the folder its class folders are in: for a
        folder, the folder itself; for a pattern, its part before the first
        wildcard; for a list, the folder the files have in common; for a tar,
        the folder its members have in common.
    ignored
        Names left out for their extension.
    offsets, sizes
        For a tar: where each member's bytes start, and how many there are.
    problems
        Candidates known to be unreadable from their listing alone (a tar's
        links), by index, with why.
    """

    kind: str
    root: str
    names: list[str]
    label_names: list[str]
    ignored: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    problems: dict[int, str] = field(default_factory=dict)

    def where(self, i: int) -> str:
        """How a user names candidate ``i``: its path, or ``tar::member``."""
        if self.kind == "tar":
            return f"{self.root}::{self.names[i]}"
        return os.path.join(self.root, *self.names[i].split("/"))


def find_images(path: Any) -> Found:
    """The image candidates ``path`` names: a folder, a glob pattern, a list of files, an image or a tar file.

    Raises
    ------
    SourceNotFoundError
        For a path or listed file that does not exist, a pattern nothing
        matches, or a folder or tar with no file of an image's name.
    UnknownFormatError
        For a file that is neither an image nor a plain tar (a compressed tar
        says how to decompress it).
    InvalidArgumentError
        For an empty list, or something that is not a path.
    """
    if isinstance(path, list | tuple):
        return _listed(path)
    text = os.path.expanduser(checked_path(path))
    if os.path.isdir(text):
        found = _walked(os.path.abspath(text))
    elif os.path.exists(text):
        found = _one_file(os.path.abspath(text))
    elif _GLOB_CHARACTERS & set(text):
        found = _matched(text)
    else:
        file_stamp(text)  # says why the path cannot be reached, as every source does
        raise SourceNotFoundError(f"{text}: no such file or directory; check the path")
    if not found.names:
        others = f"; {len(found.ignored)} other file(s): {listing(found.ignored, limit=5)}" if found.ignored else ""
        raise SourceNotFoundError(
            f"{text}: no image files (named .jpg, .jpeg, .jpe, .jfif or .png) found{others}; check the path"
        )
    return found


def name_order(name: str) -> tuple[str, ...]:
    """The sort key of a relative name: its parts, so a folder's files sort before those of a longer-named sibling.

    >>> sorted(["cat-2/a.jpg", "cat/b.jpg"], key=name_order)
    ['cat/b.jpg', 'cat-2/a.jpg']
    """
    return tuple(name.split("/"))


def _is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _hidden(name: str) -> bool:
    return any(part.startswith(".") and part not in (".", "..") for part in name.split("/"))


def _listed(paths: Sequence[Any]) -> Found:
    if not paths:
        raise InvalidArgumentError("no files given: pass a non-empty list of image files, a folder or a pattern")
    absolute = []
    for item in paths:
        path = os.path.abspath(os.path.expanduser(checked_path(item, "file")))
        file_stamp(path)  # a file named one by one that is not there is a wrong path, not a damaged image
        if os.path.isdir(path):
            raise InvalidArgumentError(
                f"{path}: a folder in a list of files; list its images, or pass the folder alone"
            )
        absolute.append(path)
    root = os.path.commonpath([os.path.dirname(p) for p in absolute])
    names = [os.path.relpath(p, root).replace(os.sep, "/") for p in absolute]
    return Found("list", root, names, list(names))


def _walked(root: str) -> Found:
    names: list[str] = []
    ignored: list[str] = []
    seen: set[tuple[int, int]] = set()

    def refuse(exc: OSError) -> None:
        # os.walk leaves out what it cannot list unless told otherwise: a class folder missing in silence.
        if isinstance(exc, PermissionError):
            raise SourcePermissionError(f"{exc.filename}: permission denied; check the folder's permissions") from None
        raise SourceNotFoundError(f"{exc.filename}: cannot be listed ({exc.strerror}); check the folder") from None

    for parent, folders, files in os.walk(root, onerror=refuse, followlinks=True):
        st = os.stat(parent)
        if (st.st_dev, st.st_ino) in seen:  # a link back up the tree: listed once already
            folders.clear()
            continue
        seen.add((st.st_dev, st.st_ino))
        folders[:] = [name for name in folders if not name.startswith(".")]
        relative = os.path.relpath(parent, root).replace(os.sep, "/")
        prefix = "" if relative == "." else relative + "/"
        for name in files:
            if name.startswith("."):
                continue
            (names if _is_image_name(name) else ignored).append(prefix + name)
    names.sort(key=name_order)
    return Found("folder", root, names, list(names), ignored=sorted(ignored, key=name_order))


def _matched(pattern: str) -> Found:
    matches = [m for m in glob.glob(pattern, recursive=True) if os.path.isfile(m)]
    if not matches:
        raise SourceNotFoundError(f"{pattern}: no file matches this pattern; check the folder and the pattern")
    parts = pattern.split(os.sep)
    fixed = next(i for i, part in enumerate(parts) if _GLOB_CHARACTERS & set(part))
    root = os.path.abspath(os.sep.join(parts[:fixed]) or ".")
    names: list[str] = []
    ignored: list[str] = []
    for match in matches:
        name = os.path.relpath(os.path.abspath(match), root).replace(os.sep, "/")
        (names if _is_image_name(name) and not _hidden(name) else ignored).append(name)
    names.sort(key=name_order)
    return Found("pattern", root, names, list(names), ignored=sorted(ignored, key=name_order))


def _one_file(path: str) -> Found:
    """A single image (a list of one), or a tar file of images."""
    with open_regular(path) as f:
        head = f.read(512 + 8)
    if head.startswith((JPEG_MAGIC, PNG_MAGIC)):
        root, name = os.path.split(path)
        return Found("list", root, [name], [name])
    for magic, (compression, command) in _COMPRESSIONS.items():
        if head.startswith(magic):
            raise UnknownFormatError(
                f"{path}: a {compression}-compressed file; a tar of images is read by each member's byte offset, "
                f"which a compressed tar has not: decompress it once ({command} {os.path.basename(path)}) and open "
                "the .tar"
            )
    if not _is_tar(path, head):
        raise UnknownFormatError(
            f"{path}: not a folder, a JPEG or PNG image, or a tar file of them (first bytes {head[:8]!r}); "
            "give a folder, a pattern like 'photos/**/*.jpg', a list of files or a .tar"
        )
    return _tar_members(path)


def _is_tar(path: str, head: bytes) -> bool:
    # POSIX and GNU tars say so at byte 257; older ones only by a header checksum that tarfile checks.
    if head[257:262] == b"ustar":
        return True
    return path.lower().endswith(".tar") and len(head) >= 512


def _tar_members(path: str) -> Found:
    at: dict[str, int] = {}
    names: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    problems: dict[int, str] = {}
    ignored: list[str] = []
    try:
        with open_regular(path) as raw, tarfile.open(fileobj=raw, mode="r:") as archive:
            for member in archive:
                name = member.name.lstrip("/")
                while name.startswith("./"):
                    name = name[2:]
                if member.isdir() or not name or _hidden(name):
                    continue
                if not _is_image_name(name):
                    ignored.append(name)
                    continue
                # A later member of the same name replaces an earlier one, as tar itself extracts them.
                i = at.setdefault(name, len(names))
                if i == len(names):
                    names.append(name)
                    offsets.append(0)
                    sizes.append(0)
                problems.pop(i, None)
                offsets[i], sizes[i] = member.offset_data, member.size
                if not member.isreg() or member.issparse():
                    problems[i] = (
                        f"a {'sparse member' if member.isreg() else 'link or special member'} of the tar, whose bytes "
                        "are not stored at one offset; re-create the tar from the files themselves "
                        "(tar --hard-dereference -cf)"
                    )
    except tarfile.TarError as exc:
        raise CorruptSourceError(f"{path}: not a readable tar file ({exc}); re-create or re-copy it") from None
    order = sorted(range(len(names)), key=lambda i: name_order(names[i]))
    found = Found(
        "tar",
        path,
        [names[i] for i in order],
        [],
        ignored=sorted(ignored, key=name_order),
        offsets=[offsets[i] for i in order],
        sizes=[sizes[i] for i in order],
        problems={new: problems[old] for new, old in enumerate(order) if old in problems},
    )
    # Class folders are those below the folder every member is in ("train/cat/1.jpg" in a tar of "train/").
    common = os.path.commonpath([os.path.dirname(n) or "." for n in found.names]) if found.names else ""
    strip = len(common) + 1 if common not in ("", ".") else 0
    found.label_names = [n[strip:] for n in found.names]
    return found


@contextlib.contextmanager
def candidate(found: Found, i: int, shared: Any) -> Iterator[tuple[io.BufferedReader, tuple[int, ...] | None]]:
    """Candidate ``i`` opened for its check: a buffered file of its bytes, and its stamp (a file's; ``None`` in a tar).

    ``shared`` is the tar file's descriptor for a tar. Raises ``OSError`` (and
    our errors for a missing, unreadable or special file) as opening it does.
    """
    if found.kind == "tar":
        yield io.BufferedReader(Window(shared, found.offsets[i], found.sizes[i])), None
        return
    with open_regular(found.where(i)) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):  # (open_regular refuses these; a stat of another file never is)
            raise CorruptSourceError(f"{found.where(i)}: not a regular file")
        yield io.BufferedReader(Window(f.fileno(), 0, st.st_size)), stamp_of(st)


__all__ = ["IMAGE_EXTENSIONS", "Found", "candidate", "find_images", "name_order"]
