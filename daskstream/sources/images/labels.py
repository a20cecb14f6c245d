"""The labels of images: each one's class folder, or its row in a CSV file.

Folders: an image's class is the first folder of its path below the folder
given (``photos/cat/1.jpg`` and ``photos/cat/kittens/2.jpg`` are both ``cat``),
the classes sorted by name and numbered from 0, as torchvision's
``ImageFolder`` numbers them. A folder whose images all lie in it directly has
no classes: its images are unlabelled.

CSV: a header row, then one row per image. The file column is the first of
:data:`FILE_COLUMNS` the header has, the label column the first of
:data:`LABEL_COLUMNS` (names compared without case); a file of exactly two
columns may name them otherwise (file, then label). A row names an image by
its path below the folder (``cat/1.jpg``), that path without its extension,
its file name (``1.jpg``) or its file name without extension (``1``: Kaggle's
ids), tried in that order. Labels that are all whole numbers are the labels
(``classes`` then names ``"0"`` to the largest); any other labels are class
names, sorted and numbered from 0.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from daskstream.errors import CorruptSourceError, InvalidArgumentError, SourceNotFoundError
from daskstream.files import open_regular
from daskstream.sources.base import checked_path, listing

FILE_COLUMNS = ("file", "filename", "file_name", "path", "image", "image_id", "id", "name")
LABEL_COLUMNS = ("label", "class", "category", "target")


@dataclass(frozen=True)
class Labels:
    """Every image's label (``None``: unlabelled) and the class names, label ``i`` being ``classes[i]``."""

    values: np.ndarray | None
    classes: tuple[str, ...]


def folder_labels(names: Sequence[str], root: str) -> Labels:
    """Labels from class folders: ``names`` are the images' paths below ``root`` (``/``-separated).

    >>> folder_labels(["dog/1.jpg", "cat/2.jpg", "cat/a/3.jpg"], "photos")
    Labels(values=array([1, 0, 0]), classes=('cat', 'dog'))
    >>> folder_labels(["1.jpg", "2.jpg"], "photos")
    Labels(values=None, classes=())
    """
    loose = [name for name in names if "/" not in name]
    if len(loose) == len(names):
        return Labels(None, ())
    if loose:
        raise InvalidArgumentError(
            f"{root}: labels='folders' takes each image's class from its folder below {root}, but "
            f"{len(loose)} of {len(names)} images lie in {root} itself ({listing(loose, limit=5)}); move them "
            "into a class folder, or pass labels=None (unlabelled) or labels='labels.csv'"
        )
    first = [name.split("/", 1)[0] for name in names]
    classes = tuple(sorted(set(first)))
    index = {name: i for i, name in enumerate(classes)}
    return Labels(np.array([index[c] for c in first], dtype=np.int64), classes)


def csv_labels(path: str, names: Sequence[str], root: str) -> Labels:
    """Labels from the CSV file ``path`` for the images ``names`` (their paths below ``root``).

    Raises
    ------
    SourceNotFoundError
        When the file does not exist.
    InvalidArgumentError
        When its columns cannot be told apart, a row has no label, a name is
        given two labels or matches two images, or an image has no row.
    """
    path = os.path.abspath(os.path.expanduser(checked_path(path, "labels")))
    rows, file_column = _read_rows(path)
    found: dict[int, int] = {}  # image -> row
    matched_by: dict[int, list[int]] = {}
    for i, name in enumerate(names):
        for key in _keys(name):
            if key in rows:
                found[i] = rows[key][0]
                matched_by.setdefault(rows[key][0], []).append(i)
                break
    twice = {row: images for row, images in matched_by.items() if len(images) > 1}
    if twice:
        row, images = next(iter(twice.items()))
        raise InvalidArgumentError(
            f"{path}: row {row} names more than one image ({listing([names[i] for i in images], limit=5)}); "
            f"name the files by their path below {root} in the {file_column!r} column"
        )
    missing = [name for i, name in enumerate(names) if i not in found]
    if missing:
        raise InvalidArgumentError(
            f"{path}: {len(missing)} of {len(names)} images have no row ({listing(missing, limit=5)}); add a row for "
            f"each (column {file_column!r}: its path below {root}, or its file name), or leave them out of what "
            "you open"
        )
    by_row = {row: label for row, label in rows.values()}
    labels = sorted(set(by_row.values()))
    if all(_whole(label) for label in labels):
        numbers = {label: int(label) for label in labels}
        values = np.array([numbers[by_row[found[i]]] for i in range(len(names))], dtype=np.int64)
        return Labels(values, tuple(str(k) for k in range(max(numbers.values()) + 1)))
    index = {label: k for k, label in enumerate(labels)}
    return Labels(np.array([index[by_row[found[i]]] for i in range(len(names))], dtype=np.int64), tuple(labels))


def _read_rows(path: str) -> tuple[dict[str, tuple[int, str]], str]:
    """Each name the CSV file gives, with its row number and label; and the file column's name."""
    try:
        raw = open_regular(path)
    except FileNotFoundError:
        raise SourceNotFoundError(f"labels={path!r}: no such file; give the CSV file of labels") from None
    except IsADirectoryError:
        raise InvalidArgumentError(
            f"labels={path!r} is a folder; give 'folders' for labels from class folders, or a CSV file"
        ) from None
    with raw:
        data = raw.read()
    try:
        # utf-8-sig: spreadsheet programs start their CSV files with a byte-order mark.
        table = csv.reader(io.StringIO(data.decode("utf-8-sig"), newline=""))
        header = next(table, None)
        if header is None:
            raise InvalidArgumentError(f"{path}: the CSV file is empty; it needs a header row, then a row per image")
        file_at, label_at = _columns(path, header)
        rows: dict[str, tuple[int, str]] = {}
        for number, row in enumerate(table, start=2):
            if not any(cell.strip() for cell in row):
                continue
            if len(row) <= max(file_at, label_at):
                raise InvalidArgumentError(f"{path}: row {number} has {len(row)} cells, fewer than its header")
            key, label = _key(row[file_at]), row[label_at].strip()
            if not key or not label:
                raise InvalidArgumentError(f"{path}: row {number} has no {'file' if not key else 'label'}")
            if key in rows and rows[key][1] != label:
                raise InvalidArgumentError(
                    f"{path}: {key!r} is labelled twice, {rows[key][1]!r} (row {rows[key][0]}) and {label!r} "
                    f"(row {number}); keep one"
                )
            rows.setdefault(key, (number, label))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise CorruptSourceError(f"{path}: not a readable UTF-8 CSV file ({exc})") from None
    return rows, header[file_at].strip()


def _columns(path: str, header: list[str]) -> tuple[int, int]:
    """Where the file names and the labels are, from the header."""
    names = [cell.strip().lower() for cell in header]
    file_at = next((names.index(c) for c in FILE_COLUMNS if c in names), None)
    label_at = next((names.index(c) for c in LABEL_COLUMNS if c in names), None)
    if file_at is None or label_at is None:
        if len(names) == 2:
            return 0, 1
        raise InvalidArgumentError(
            f"{path}: cannot tell which column names the files and which the labels (columns: {', '.join(header)}); "
            f"name them {FILE_COLUMNS[0]!r} and {LABEL_COLUMNS[0]!r}, or keep only those two columns"
        )
    return file_at, label_at


def _key(cell: str) -> str:
    """A file name as a CSV row gives it, in the form names are compared in.

    >>> _key(" ./cat\\\\1.jpg ")
    'cat/1.jpg'
    """
    key = cell.strip().replace("\\", "/")
    while key.startswith("./"):
        key = key[2:]
    return key


def _keys(name: str) -> list[str]:
    """The names a row may give an image by, in the order they are tried.

    >>> _keys("cat/1.jpg")
    ['cat/1.jpg', 'cat/1', '1.jpg', '1']
    """
    base = name.rsplit("/", 1)[-1]
    return list(dict.fromkeys([name, os.path.splitext(name)[0], base, os.path.splitext(base)[0]]))


def _whole(label: str) -> bool:
    return label.isdigit() and label.isascii()


__all__ = ["FILE_COLUMNS", "LABEL_COLUMNS", "Labels", "csv_labels", "folder_labels"]
