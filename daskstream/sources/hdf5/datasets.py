"""Finding a dataset in an HDF5 file: by its path, or the only one, and what the file has when it is not there.

A dataset that is not found, or a group named in its place, is refused with
the datasets the file (or group) does hold; a link whose object HDF5 cannot
open, or a file whose objects it cannot walk, is damage, said as such.
"""

from __future__ import annotations

from typing import Any

from daskstream.advice import keyword, said
from daskstream.errors import CorruptSourceError, MemberNotFoundError, NotAnArrayError, first_line
from daskstream.sources.base import listing


def _find_dataset(f: Any, path: str, dataset: str | None, h5py: Any) -> Any:
    if dataset is None:
        found = _list_datasets(f, h5py)
        if len(found) == 1:
            return f[found[0]]
        have = listing(found, empty="no datasets")
        raise MemberNotFoundError(
            said(
                f"{path}: give the dataset to read, as ",
                keyword("dataset", ...),
                f" or '{path}::/name'; the file has: {have}",
            )
        )
    try:
        obj = f[dataset]
    except KeyError as exc:
        if _link_exists(f, dataset):
            # HDF5 found the dataset but refused its header: sizes that contradict each other or the file.
            raise CorruptSourceError(
                f"{path}::{dataset}: HDF5 could not open the dataset ({first_line(exc)}); its header is damaged or "
                "forged: re-create or re-copy the file"
            ) from None
        have = listing(_list_datasets(f, h5py), empty="no datasets")
        raise MemberNotFoundError(f"dataset {dataset!r} not found in {path}; it has: {have}") from None
    if not isinstance(obj, h5py.Dataset):
        inside = listing(_list_datasets(obj, h5py), empty="none")
        raise NotAnArrayError(f"{path}::{dataset} is a group, not a dataset; datasets inside it: {inside}")
    return obj


def _link_exists(f: Any, name: str) -> bool:
    """Whether ``f`` has a link of that name, whether or not the object it leads to opens."""
    try:
        return f.get(name, getlink=True) is not None
    except (KeyError, RuntimeError, OSError, ValueError):
        return False


def _list_datasets(group: Any, h5py: Any) -> list[str]:
    names: list[str] = []

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            names.append(obj.name)

    try:
        group.visititems(visit)
    except (KeyError, RuntimeError) as exc:  # an object whose header HDF5 refuses (OSError is h5py's own)
        raise CorruptSourceError(
            f"{group.file.filename}: HDF5 could not open every object in the file ({first_line(exc)}); the file is "
            "damaged or forged: re-create or re-copy it"
        ) from None
    return names
