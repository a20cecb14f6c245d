"""Files an HDF5 dataset takes its data from besides its own: what is read, checked before it is.

An HDF5 file can point elsewhere: an *external link* names a dataset in
another file, *external raw storage* keeps a dataset's bytes in plain files,
and a *virtual dataset* maps regions of datasets in other files. h5py follows
all three silently, so a file received from someone else could read
``/etc/passwd`` or a named pipe that blocks forever, and a virtual dataset
whose source file is missing reads as its fill value without an error.

Here every such file is found before anything is read. Each must exist, be a
regular file, and lie inside the opened file's folder unless
``daskstream.sources.allow-outside-files`` is set; the source then stamps them
all, so a change to any of them after opening is caught like a change to the
file itself. A file on an object store may point nowhere else: the names it
holds are paths on some disk, not objects (:func:`refuse_links_out_of_object`).
"""

from __future__ import annotations

import glob
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from daskstream import config
from daskstream.errors import CorruptSourceError, OutsideFileError
from daskstream.sources.base import file_stamp

# Links followed, and virtual datasets entered, before a chain of them is taken for a loop.
_MAX_HOPS = 16
_OPT_IN = "daskstream.sources.allow-outside-files"


@dataclass(frozen=True)
class LinkedFile:
    """One file a dataset's data comes from.

    Attributes
    ----------
    role
        ``"external link"``, ``"external raw storage"`` or ``"virtual dataset source"``.
    path
        The absolute path HDF5 opens.
    declared
        The name as the HDF5 file writes it.
    """

    role: str
    path: str
    declared: str


def check_external_links(f: Any, top: str, dataset: str, h5py: Any) -> tuple[LinkedFile, ...]:
    """Check every external link on the way to ``dataset`` before h5py follows it.

    h5py opens a link's target file the moment the path is looked up, so the
    target is checked first: it must exist, be a regular file (a named pipe
    would block the lookup forever) and be allowed (see :func:`check_linked_files`).

    Returns
    -------
    tuple of LinkedFile
        The files passed through, in order.
    """
    return _walk(f, top, dataset, h5py, hops=0)


def _walk(f: Any, top: str, dataset: str, h5py: Any, hops: int) -> tuple[LinkedFile, ...]:
    def through(link: Any, f: Any, rest: str, hops: int) -> tuple[LinkedFile, ...]:
        where = _resolve_link_target(link.filename, os.path.dirname(f.filename))
        linked = LinkedFile("external link", where, link.filename)
        check_linked_files(f"{top}::{dataset}", top, (linked,))
        try:
            other = h5py.File(where, "r")
        except OSError as exc:
            raise CorruptSourceError(
                f"{top}::{dataset}: the external link to {where} leads to a file HDF5 cannot open "
                f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); fix or remove the link"
            ) from None
        with other:
            return (linked, *_walk(other, top, posixpath.join(link.path, rest), h5py, hops))

    return _follow_links(f, dataset, h5py, hops, through, lambda path: f"{top}::{path}")


def _follow_links(
    f: Any,
    dataset: str,
    h5py: Any,
    hops: int,
    external: Callable[[Any, Any, str, int], tuple[LinkedFile, ...]],
    name: Callable[[str], str],
) -> tuple[LinkedFile, ...]:
    """Walk ``dataset``'s path in ``f``, soft links followed, to its first external link.

    Returns what ``external(link, f, rest of the path, hops)`` makes of that
    link, or ``()`` when the path has none (or is not there: the lookup that
    follows reports it with what the file holds). ``name(path)`` names the
    dataset when the links run too long in a row to be anything but a loop.
    """
    if hops > _MAX_HOPS:
        raise CorruptSourceError(f"{name(dataset)}: more than {_MAX_HOPS} links in a row; they may form a loop")
    parts = [part for part in dataset.split("/") if part]
    try:
        group = f["/"]
    except (KeyError, ValueError, OSError):
        return ()  # a root group HDF5 cannot open: the lookup that follows reports the damage
    for i, part in enumerate(parts):
        try:
            link = group.get(part, getlink=True)
        except (KeyError, ValueError, OSError):
            return ()
        rest = "/".join(parts[i + 1 :])
        if isinstance(link, h5py.SoftLink):
            target = posixpath.normpath(posixpath.join(group.name, link.path))
            return _follow_links(f, posixpath.join(target, rest), h5py, hops + 1, external, name)
        if isinstance(link, h5py.ExternalLink):
            return external(link, f, rest, hops + 1)
        if i < len(parts) - 1:
            try:
                group = group[part]
            except (KeyError, ValueError, OSError):
                return ()
            if not isinstance(group, h5py.Group):
                return ()
    return ()


def linked_files(path: str, dset: Any, h5py: Any) -> tuple[LinkedFile, ...]:
    """The files ``dset`` (opened from ``path``) reads its data from: external raw storage and virtual sources.

    Virtual sources are followed into their own files, which may map further
    ones, up to a bound that catches loops.
    """
    found: list[LinkedFile] = []
    _collect(path, dset, h5py, found, hops=0, seen=set())
    return tuple(dict.fromkeys(found))


def _collect(path: str, dset: Any, h5py: Any, found: list[LinkedFile], hops: int, seen: set) -> None:
    if hops > _MAX_HOPS:
        raise CorruptSourceError(f"{path}::{dset.name}: virtual datasets nest more than {_MAX_HOPS} deep")
    create = dset.id.get_create_plist()
    here = os.path.abspath(dset.file.filename)
    for i in range(create.get_external_count()):
        declared = create.get_external(i)[0].decode(errors="surrogateescape")
        found.append(LinkedFile("external raw storage", _resolve_raw(declared), declared))
    if create.get_layout() != h5py.h5d.VIRTUAL:
        return
    for i in range(create.get_virtual_count()):
        declared = create.get_virtual_filename(i)
        name = create.get_virtual_dsetname(i)
        files = [here] if declared == "." else _resolve_virtual(declared, here)
        for source_file in files:
            if source_file != here:
                found.append(LinkedFile("virtual dataset source", source_file, declared))
            key = (source_file, name)
            if key in seen or not os.path.isfile(source_file):
                continue  # missing ones are refused by check_linked_files
            seen.add(key)
            check_linked_files(f"{path}::{dset.name}", path, tuple(found))
            with h5py.File(source_file, "r") as other:
                inner = other.get(name)
                if isinstance(inner, h5py.Dataset):
                    _collect(path, inner, h5py, found, hops + 1, seen)


def check_linked_files(name: str, top: str, files: tuple[LinkedFile, ...]) -> None:
    """Refuse linked files that are missing, not regular files, or outside ``top``'s folder (unless allowed).

    Raises
    ------
    CorruptSourceError
        For a missing file: a virtual dataset would read its fill value there,
        external storage would fail mid-computation.
    NotARegularFileError
        For a pipe, socket or device.
    OutsideFileError
        For a file outside the folder of ``top``, the file opened.
    """
    folder = os.path.dirname(os.path.realpath(top))
    allowed = bool(config.get("sources.allow-outside-files"))
    for linked in files:
        if not os.path.lexists(linked.path):
            what = "reads its fill value there" if linked.role == "virtual dataset source" else "cannot be read"
            raise CorruptSourceError(
                f"{name}: its {linked.role} {linked.path} is missing, so the data {what}; "
                "put the file back, or open the files the dataset maps directly"
            )
        file_stamp(linked.path)  # a pipe, socket or device is refused before HDF5 opens it
        real = os.path.realpath(linked.path)
        if not allowed and os.path.commonpath([folder, real]) != folder:
            raise OutsideFileError(
                f"{name}: its {linked.role} is {real}, outside {folder}; daskstream reads files an HDF5 "
                f"file points to only inside its own folder. If you trust this file, set {_OPT_IN}: true "
                f'(dask.config.set({{"{_OPT_IN}": True}}) or DASK_DASKSTREAM__SOURCES__ALLOW_OUTSIDE_FILES=true)'
            )


def external_prefix(files: tuple[LinkedFile, ...]) -> str | None:
    """The folder relative external raw files were found from, to read the same files in every process."""
    if any(f.role == "external raw storage" and not os.path.isabs(f.declared) for f in files):
        return _raw_prefix() + os.sep
    return None


def _raw_prefix() -> str:
    # HDF5's rule for relative external raw files: $HDF5_EXTFILE_PREFIX, else the working directory.
    prefix = os.environ.get("HDF5_EXTFILE_PREFIX", "")
    return os.path.abspath(prefix) if prefix and "${ORIGIN}" not in prefix else os.getcwd()


def _resolve_raw(declared: str) -> str:
    return declared if os.path.isabs(declared) else os.path.normpath(os.path.join(_raw_prefix(), declared))


def _resolve_link_target(declared: str, parent_folder: str) -> str:
    """Where HDF5 finds an external link's file: as written if absolute, else beside the linking file, else here."""
    if os.path.isabs(declared):
        return declared
    candidates = [os.path.join(prefix, declared) for prefix in _env_prefixes("HDF5_EXT_PREFIX")]
    candidates += [os.path.join(parent_folder, declared), os.path.abspath(declared)]
    return os.path.normpath(next((c for c in candidates if os.path.lexists(c)), candidates[-2]))


def _resolve_virtual(declared: str, vds_file: str) -> list[str]:
    """The files a virtual dataset's mapping names (several for a ``%b`` pattern); relative to the virtual file."""
    if os.path.isabs(declared):
        candidates = [declared]
    else:
        candidates = [os.path.join(prefix, declared) for prefix in _env_prefixes("HDF5_VDS_PREFIX")]
        candidates += [os.path.join(os.path.dirname(vds_file), declared), os.path.abspath(declared)]
    if "%b" in declared:
        return sorted({os.path.normpath(hit) for c in candidates for hit in glob.glob(c.replace("%b", "*"))})
    index = os.path.dirname(vds_file) if not os.path.isabs(declared) else None
    found = next((c for c in candidates if os.path.lexists(c)), None)
    if found is None:
        found = os.path.join(index, declared) if index else declared
    return [os.path.normpath(found)]


def _env_prefixes(variable: str) -> list[str]:
    value = os.environ.get(variable, "")
    return [os.path.abspath(p) for p in value.split(os.pathsep) if p and "${ORIGIN}" not in p]


def refuse_links_out_of_object(f: Any, name: str, dataset: str | None, dset: Any, h5py: Any) -> None:
    """Refuse a dataset of a file on an object store whose data another file holds.

    External links, external raw storage and virtual datasets name files by
    path: on an object store HDF5 would look for them on this machine's disk.
    External links on the way to ``dataset`` are checked before h5py follows
    them (pass ``dset=None``); the dataset's own storage once it is found.

    Raises
    ------
    OutsideFileError
        Naming the file the data would come from.
    """
    if dset is None:

        def refuse(link: Any, *_: Any) -> tuple[LinkedFile, ...]:
            _refuse(name, "an external link", link.filename)
            return ()

        _follow_links(f, dataset or "", h5py, 0, refuse, lambda path: path)
        return
    create = dset.id.get_create_plist()
    if create.get_external_count():
        _refuse(name, "external raw storage", create.get_external(0)[0].decode(errors="surrogateescape"))
    if create.get_layout() == h5py.h5d.VIRTUAL:
        _refuse(name, "a virtual dataset mapping", create.get_virtual_filename(0))


def _refuse(name: str, role: str, declared: str) -> None:
    raise OutsideFileError(
        f"{name}: its data comes through {role} from {declared!r}, a file named by path, which HDF5 would "
        "open from this machine's disk rather than the object store; read the files from a local copy, or "
        "copy the data into the file (h5py: f.copy, or h5repack)"
    )
