"""Digests that give a rewritten Zarr array a new token, and tell its metadata from another's.

Rewritten data often leaves the metadata as it was: a local store's digest
covers its directory tree (inode numbers and folder times), a remote store's
its objects' listing with their versions, and the metadata zarr decodes with
has a digest of its own that every process opening the array compares.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from typing import Any

import numpy as np


def metadata_digest(array: Any) -> str:
    """A digest of the metadata zarr reads ``array``'s chunks with: dtype, shape, chunks, codecs, fill value,
    attributes (format 2's ``.zattrs`` too), wherever zarr took it from (the array's own document or a group's
    consolidated metadata)."""
    with warnings.catch_warnings():
        # zarr warns, each time, of data types whose format 3 specification is not settled yet.
        warnings.simplefilter("ignore")
        document = json.dumps(array.metadata.to_dict(), sort_keys=True, default=_json_name)
    return hashlib.sha1(document.encode(), usedforsecurity=False).hexdigest()


def _json_name(value: Any) -> Any:
    """Numbers as numbers; anything else zarr's metadata holds by its type (never a repr with an address)."""
    if isinstance(value, np.generic):
        return value.item()
    return type(value).__qualname__


def _listing_digest(objects: dict[str, str]) -> str:
    """A digest of an object listing: every key and its version."""
    return hashlib.sha1(repr(sorted(objects.items())).encode(), usedforsecurity=False).hexdigest()


def _tree_digest(root: str, member: str | None) -> str:
    """A digest of every file and folder in an array's directory tree, to give rewritten data a new token.

    zarr (like rsync and tar) writes a chunk to a new file and renames it into
    place: the chunk file's inode number changes, and so do its folder's times.
    Inode numbers come with the listing, so this costs one listing of the tree
    and one ``stat`` per folder, not one per chunk. (A chunk overwritten in
    place, as ``cp`` onto an existing file does, keeps its inode; every read
    still checks each chunk's change time against when the source was opened.)
    """
    digest = hashlib.sha1(usedforsecurity=False)
    pending = [os.path.join(root, member or "")]
    while pending:
        folder = pending.pop()
        try:
            st = os.stat(folder)
            with os.scandir(folder) as entries:
                listed = sorted((entry.name, entry.inode(), entry.is_dir(follow_symlinks=False)) for entry in entries)
        except OSError:
            continue  # vanished meanwhile: the reads that follow report it
        digest.update(repr((folder, st.st_mtime_ns, st.st_ctime_ns, listed)).encode())
        pending.extend(os.path.join(folder, name) for name, _, is_dir in listed if is_dir)
    return digest.hexdigest()
