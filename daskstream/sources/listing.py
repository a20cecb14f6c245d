"""What a file or store holds: its groups and arrays as a tree, for ``ds.list`` and ``daskstream info``.

Each array is described from its metadata alone (nothing is read): shape,
dtype, storage chunks, codecs or filters, size, dimension names and a few
attributes; each group by its attributes. HDF5 files are walked with h5py
(hard links only: a soft or external link is listed as the link it is, not
followed), Zarr stores with zarr, a ``.npy`` file is one array.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from daskstream.errors import CorruptSourceError, first_line
from daskstream.planning.budget import format_size
from daskstream.sources.detect import guess_format
from daskstream.sources.hdf5.filters import filter_names, import_h5py
from daskstream.sources.hdf5.types import hdf5_type_text, unreadable_type_text
from daskstream.sources.metadata import hdf5_attrs, hdf5_dims, json_ready, zarr_attrs, zarr_dims
from daskstream.sources.npy import NpySource
from daskstream.sources.zarr.checks import checked_store
from daskstream.sources.zarr.codecs import codec_names
from daskstream.sources.zarr.nodes import folder_node_type
from daskstream.sources.zarr.source import local_path
from daskstream.sources.zip_members import ZipMembers

#: Attributes shown per entry in the tree's text (all are kept in ``attrs``).
SHOWN_ATTRS = 4


@dataclass(frozen=True)
class Entry:
    """One group, array or link of a file's tree.

    Attributes
    ----------
    path
        Its path inside the file (``"/"`` for the root; ``""`` for a ``.npy`` file's one array).
    kind
        ``"group"``, ``"array"`` or ``"link"`` (an HDF5 soft or external link, not followed).
    shape, dtype, chunks, codecs, nbytes, dims
        For arrays: as :class:`~daskstream.Source` names them (``nbytes`` the
        array's bytes in memory; ``dtype`` as text, so types numpy cannot hold
        are named too).
    attrs
        The entry's attributes, strings decoded.
    target
        Where a link points.
    """

    path: str
    kind: str
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    chunks: tuple[int, ...] | None = None
    codecs: tuple[str, ...] = ()
    nbytes: int | None = None
    dims: tuple[str | None, ...] | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    target: str | None = None

    @property
    def name(self) -> str:
        if not self.path:
            return "(the file's array)"
        return self.path.rstrip("/").rsplit("/", 1)[-1] or "/"

    @property
    def depth(self) -> int:
        return len([p for p in self.path.split("/") if p])

    def summary(self) -> str:
        """One line: ``"x  float32 (1000, 512)  chunks (100, 512)  gzip  1.95 MiB  dims (time, y)"``."""
        if self.kind == "group":
            return f"{self.name}/"
        if self.kind == "link":
            return f"{self.name} -> {self.target}"
        if self.shape is None:
            return f"{self.name}  {self.dtype or 'no data (null dataspace)'}"
        parts = [self.name, f"{self.dtype} {self.shape}"]
        parts.append(f"chunks {self.chunks}" if self.chunks else "contiguous")
        if self.codecs:
            parts.append(", ".join(self.codecs))
        if self.nbytes is not None:
            parts.append(format_size(self.nbytes))
        if self.dims:
            parts.append("dims (" + ", ".join(d or "-" for d in self.dims) + ")")
        return "  ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "kind": self.kind}
        if self.kind == "array":
            out.update(
                shape=list(self.shape or ()),
                dtype=self.dtype,
                chunks=None if self.chunks is None else list(self.chunks),
                codecs=list(self.codecs),
                nbytes=self.nbytes,
                dims=None if self.dims is None else list(self.dims),
            )
        if self.kind == "link":
            out["target"] = self.target
        out["attrs"] = json_ready(self.attrs)
        return out


@dataclass(frozen=True)
class Listing:
    """The tree of a file or store: :func:`list_file`'s answer.

    Iterating gives the entries, parents before children; ``arrays`` the
    paths of the arrays (what ``ds.open(path, dataset=...)`` takes).
    """

    path: str
    format: str
    entries: tuple[Entry, ...]

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, path: str) -> Entry:
        for entry in self.entries:
            if entry.path == path or entry.path.strip("/") == path.strip("/"):
                return entry
        raise KeyError(path)

    @property
    def arrays(self) -> list[str]:
        return [e.path for e in self.entries if e.kind == "array"]

    def text(self) -> str:
        """The tree for a terminal: one line per entry, indented by depth, a few attributes under each."""
        arrays = self.arrays
        total = sum(e.nbytes or 0 for e in self.entries if e.kind == "array")
        lines = [f"{self.path} ({self.format}): {len(arrays)} array(s), {format_size(total)}"]
        for entry in self.entries:
            if entry.path in ("/", ""):
                indent = "  "
                if entry.kind == "array":
                    lines.append(indent + entry.summary())
            else:
                indent = "  " * entry.depth
                lines.append(indent + entry.summary())
            for key, value in list(entry.attrs.items())[:SHOWN_ATTRS]:
                lines.append(f"{indent}  @{key} = {_short(value)}")
            if len(entry.attrs) > SHOWN_ATTRS:
                lines.append(f"{indent}  ... {len(entry.attrs) - SHOWN_ATTRS} more attribute(s)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"<daskstream Listing\n{self.text()}>"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "entries": [e.to_dict() for e in self.entries]}

    def _repr_html_(self) -> str:
        rows = []
        for entry in self.entries:
            pad = 1.2 * max(entry.depth - 1, 0) if entry.path not in ("/", "") else 0
            name = html.escape(entry.name + ("/" if entry.kind == "group" and entry.name != "/" else ""))
            if entry.kind == "link":
                name += f" &rarr; {html.escape(str(entry.target))}"
            attrs = ", ".join(
                f"{html.escape(k)}={html.escape(_short(v))}" for k, v in list(entry.attrs.items())[:SHOWN_ATTRS]
            )
            cells = (
                [
                    entry.dtype or "",
                    str(entry.shape or ""),
                    str(entry.chunks or ("contiguous" if entry.kind == "array" else "")),
                    ", ".join(entry.codecs),
                    format_size(entry.nbytes) if entry.nbytes is not None else "",
                    ", ".join(d or "-" for d in entry.dims) if entry.dims else "",
                ]
                if entry.kind == "array"
                else [""] * 6
            )
            rows.append(
                f"<tr><td style='padding-left:{pad:.1f}em;text-align:left'><b>{name}</b></td>"
                + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
                + f"<td style='text-align:left'>{attrs}</td></tr>"
            )
        head = "".join(
            f"<th>{h}</th>" for h in ("name", "dtype", "shape", "chunks", "codecs", "size", "dims", "attributes")
        )
        return (
            f"<div><b>{html.escape(self.path)}</b> ({html.escape(self.format)}, {len(self.arrays)} array(s))"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        )


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value.tolist()) if isinstance(value, np.ndarray) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def list_file(path: str | os.PathLike[str]) -> Listing:
    """The tree of the ``.npy`` file, HDF5 file or Zarr store at ``path`` (metadata only: nothing is read).

    Raises
    ------
    SourceNotFoundError, UnknownFormatError, CorruptSourceError
        As :func:`daskstream.open_source` does for a path it cannot read.
    """
    where = local_path(os.fspath(path))
    kind = guess_format(where)
    if kind == "npy":
        return Listing(where, "npy", (_npy_entry(where),))
    if kind == "hdf5":
        return Listing(where, "hdf5", tuple(_hdf5_entries(where)))
    return Listing(where, "zarr", tuple(_zarr_entries(where)))


def _npy_entry(path: str) -> Entry:
    source = NpySource(path)
    return Entry("", "array", source.shape, str(source.dtype), None, (), int(source.nbytes), None, {})


def _hdf5_entries(path: str) -> Iterator[Entry]:
    h5py = import_h5py()
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise CorruptSourceError(f"{path}: HDF5 could not open it ({exc}); it may be truncated or damaged") from None
    with f:
        yield Entry("/", "group", attrs=hdf5_attrs(f))
        found: list[Entry] = []

        def visit(name: str, link: Any) -> None:
            where = "/" + name
            if isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
                target = link.path if isinstance(link, h5py.SoftLink) else f"{link.filename}::{link.path}"
                found.append(Entry(where, "link", target=target))
                return
            obj = f.get(where)
            if isinstance(obj, h5py.Group):
                found.append(Entry(where, "group", attrs=hdf5_attrs(obj)))
            elif isinstance(obj, h5py.Dataset):
                found.append(_hdf5_dataset(where, obj, h5py))

        f.visititems_links(visit)
        yield from found


def _hdf5_dataset(where: str, dset: Any, h5py: Any) -> Entry:
    shape = None if dset.shape is None else tuple(int(n) for n in dset.shape)
    try:
        dtype = dset.dtype
        text = hdf5_type_text(dtype, h5py)
        itemsize = dtype.itemsize
    except (TypeError, ValueError):  # an HDF5 type numpy has no equivalent for (time, quad precision...)
        text, itemsize = f"{unreadable_type_text(dset.id.get_type(), h5py)} (not readable as numpy)", None
    filters = filter_names(dset.id.get_create_plist())
    nbytes = None if shape is None or itemsize is None else math.prod(shape) * itemsize
    dims = hdf5_dims(dset, len(shape or ()))
    return Entry(where, "array", shape, text, dset.chunks, filters, nbytes, dims, hdf5_attrs(dset))


def _zarr_entries(path: str) -> Iterator[Entry]:
    import zarr

    if not os.path.isdir(path):
        # A zipped store: zarr walks it (one array zarr cannot open stops the walk), reading its metadata
        # members within the sizes they may hold (zipfile believes what the zip's directory states).
        try:
            store = checked_store(zarr.storage.ZipStore(path, mode="r"), ZipMembers(path))
            root = zarr.open(store=store, mode="r")
            nodes = (
                [("", root), *sorted(root.members(max_depth=None), key=lambda m: m[0])]
                if isinstance(root, zarr.Group)
                else [("", root)]
            )
        except Exception as exc:  # zarr raises many kinds for metadata it cannot read
            raise CorruptSourceError(f"{path}: zarr could not list the store ({first_line(exc)})") from None
        for name, node in nodes:
            yield _zarr_node("/" + name, node, zarr)
        return
    # A directory: walked here, so that one node zarr cannot open is listed as such instead of ending the walk.
    # Depth first with a stack of its own (os.walk recurses, and a tree thousands of folders deep would end
    # it with a RecursionError), children in name order, as os.walk top-down with sorted folders.
    stack = [path]
    while stack:
        folder = stack.pop()
        kind = folder_node_type(folder)
        if kind in ("array", "group"):
            where = "/" + os.path.relpath(folder, path).replace(os.sep, "/").removeprefix(".").strip("/")
            opened: Any = None
            try:
                opened = zarr.open_array(folder, mode="r") if kind == "array" else zarr.open_group(folder, mode="r")
            except Exception as exc:  # zarr raises many kinds for metadata it cannot read
                yield Entry(where, kind, dtype=f"not readable by zarr ({first_line(exc)})" if kind == "array" else None)
            if opened is not None:
                yield _zarr_node(where, opened, zarr)
            if kind == "array":
                continue  # an array's folders hold its chunks
        stack.extend(reversed(_subfolders(folder)))


def _subfolders(folder: str) -> list[str]:
    """The folders in ``folder`` that may hold Zarr nodes, in name order (hidden ones and links to folders
    left out, as os.walk leaves links)."""
    try:
        with os.scandir(folder) as entries:
            names = sorted(e.name for e in entries if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))
    except OSError:
        return []  # unreadable: os.walk skips it too
    return [os.path.join(folder, name) for name in names]


def _zarr_node(where: str, node: Any, zarr: Any) -> Entry:
    if isinstance(node, zarr.Array):
        return _zarr_array(where, node)
    return Entry(where, "group", attrs=zarr_attrs(node))


def _zarr_array(where: str, array: Any) -> Entry:
    shards = getattr(array, "shards", None)
    chunks = tuple(int(c) for c in (shards or array.chunks))
    return Entry(
        where,
        "array",
        tuple(int(n) for n in array.shape),
        str(array.dtype),
        chunks,
        codec_names(array),
        int(math.prod(array.shape) * array.dtype.itemsize),
        zarr_dims(array),
        zarr_attrs(array),
    )
