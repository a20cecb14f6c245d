"""What a Zarr store's metadata documents make of its folders: arrays, groups, or neither.

Arrays are found from metadata keys alone (:func:`_arrays_among`), so one
unreadable array does not hide the others, and a folder's node type is read
from its own documents (:func:`folder_node_type`); the metadata files zarr will
read are checked to be regular files first, since opening a pipe blocks forever.
"""

from __future__ import annotations

import json
import os
import posixpath
from typing import Any

from daskstream.errors import DaskstreamError
from daskstream.files import open_regular
from daskstream.sources.base import file_stamp

ZARR_METADATA_FILES = ("zarr.json", ".zarray", ".zgroup")


# Larger metadata documents are not Zarr metadata anyone wrote by hand or by a library.
_MAX_METADATA_BYTES = 64 * 2**20


def _arrays_among(keys: list[tuple[str, str]], read: Any) -> list[str]:
    """The arrays among ``(name in the store, key to read)`` pairs: folders holding array metadata.

    Names leading outside the store (absolute, or with ``..``) are skipped, and
    so is metadata that cannot be read.
    """
    arrays = []
    for name, key in keys:
        parent, leaf = posixpath.split(name)
        parts = parent.split("/")
        if parent in ("", ".") or name.startswith("/") or ".." in parts:
            continue
        if leaf == ".zarray":
            arrays.append(parent)
        elif leaf == "zarr.json":
            try:
                raw = read(key)
            except (OSError, ValueError, KeyError, DaskstreamError):
                continue
            if _node_type(raw) == "array":
                arrays.append(parent)
    return sorted(arrays)


def _check_metadata_files(root: str, member: str) -> None:
    """Refuse pipes, sockets and devices among the metadata files zarr will read: opening one blocks forever."""
    folder = root
    for part in ["", *[p for p in member.split("/") if p]]:
        folder = os.path.join(folder, part) if part else folder
        for name in (*ZARR_METADATA_FILES, ".zattrs", ".zmetadata"):
            meta = os.path.join(folder, name)
            if os.path.lexists(meta):
                file_stamp(meta)


def _member_name(array: Any) -> str | None:
    name = (array.path or "").strip("/")
    return name or None


def folder_node_type(folder: str) -> str | None:
    """What a folder's Zarr metadata files make it: ``"array"``, ``"group"``, ``"damaged"`` (a ``zarr.json``
    that does not read as JSON) or ``None`` (no Zarr metadata)."""
    meta = os.path.join(folder, "zarr.json")
    if os.path.exists(meta):
        try:
            with open_regular(meta) as f:
                node_type = json.load(f).get("node_type")
        except (OSError, ValueError, AttributeError, RecursionError):
            return "damaged"
        return "array" if node_type == "array" else "group"
    if os.path.exists(os.path.join(folder, ".zarray")):
        return "array"
    if os.path.exists(os.path.join(folder, ".zgroup")):
        return "group"
    return None


def _node_type(raw: bytes) -> str | None:
    try:
        return json.loads(raw).get("node_type")
    except (ValueError, AttributeError, RecursionError):
        return None
