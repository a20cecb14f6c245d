"""What in a task graph may read stored data from a place daskstream cannot name.

A daskstream read layer names what it reads (its Source's path or URL); an
in-memory value reads nothing. Anything else a graph holds -- a ``zarr.Array``
from ``da.from_zarr``, an h5py dataset, an xarray backend array, an object a
closure captured -- may read any file or object, and where from is not known.
:func:`unplaced_readers` lists those, so that a write that cannot be undone
(an object store has no rename to swap with) is refused unless the graph is
known to read only what it names. The guard lists what it knows to be inert
and reports everything else: an object of a kind it has not met is a reader
until shown otherwise.

What it cannot see is code that opens files by name on its own (a function
calling ``np.load("a.npy")``): functions are looked into for the objects they
hold (closures, defaults, the globals they name), not for what they do.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterator, Mapping
from typing import Any

import dask._task_spec as task_spec
import numpy as np
from dask.blockwise import Blockwise
from dask.highlevelgraph import HighLevelGraph

from daskstream.sources.base import Source

__all__ = ["sources_read", "unplaced_readers"]

# Values that hold data in memory or describe it, and read nothing.
_INERT = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    bytearray,
    slice,
    type(Ellipsis),
    range,
    np.generic,
    np.dtype,
    type,
    types.ModuleType,
    types.CodeType,
    np.ufunc,
    task_spec.TaskRef,
    task_spec.Alias,
)
# Libraries whose functions and helper objects compute on what they are given: an object of theirs that
# holds nothing beyond its attributes is looked into, not taken as a reader. (dask's own arrays and graphs
# are looked into as graphs.)
_COMPUTING_LIBRARIES = ("builtins", "operator", "functools", "itertools", "math", "numpy", "dask", "toolz", "tlz")
# How deep the search follows references; graphs are shallow, objects a closure holds may not be.
_MOST_DEPTH = 40
# Elements of an object array looked at: beyond, an array of objects is taken as a reader.
_MOST_ELEMENTS = 10_000


def unplaced_readers(collection: Any) -> list[str]:
    """What in ``collection``'s graph may read stored data from places daskstream cannot name, described.

    Empty when the graph reads only through daskstream sources (whose
    places are known) and holds only in-memory values.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> unplaced_readers(da.from_array(np.arange(4), chunks=2) * 2)
    []
    >>> import zarr
    >>> unplaced_readers(da.from_zarr(zarr.zeros((4,), chunks=(2,))))
    ['zarr.core.array.Array']
    """
    search = _Search()
    search.graph(collection.__dask_graph__())
    return list(dict.fromkeys(search.found))


def sources_read(collection: Any) -> list[Source]:
    """Every daskstream Source ``collection``'s graph reads, wherever it holds it: in a read layer, or inside
    another layer's objects (a kernel's regions, a closure) where :func:`~daskstream.graph.layers.read_layers`
    does not look.

    >>> import dask.array as da, numpy as np
    >>> sources_read(da.ones(3))
    []
    """
    search = _Search()
    search.graph(collection.__dask_graph__())
    return list({id(source): source for source in search.sources}.values())


class _Search:
    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.found: list[str] = []
        self.sources: list[Source] = []

    def graph(self, graph: Any) -> None:
        if id(graph) in self.seen:
            return
        self.seen.add(id(graph))
        layers = graph.layers.values() if isinstance(graph, HighLevelGraph) else [graph]
        for layer in layers:
            if isinstance(layer, Blockwise):
                # One task stands for them all; the constants it takes are layers of their own, searched as such.
                self.value(layer.task, 0)
                for name, index in layer.indices:
                    if index is None:
                        self.value(name, 0)
                continue
            for value in layer.values() if isinstance(layer, Mapping) else ():
                self.value(value, 0)

    def value(self, value: Any, depth: int) -> None:
        if isinstance(value, _INERT):
            return
        if id(value) in self.seen:
            return
        self.seen.add(id(value))
        if depth > _MOST_DEPTH:
            self.found.append(f"{_described(value)} (too deeply nested to look into)")
            return
        for part in self._parts(value):
            self.value(part, depth + 1)

    def _parts(self, value: Any) -> Iterator[Any]:
        """What ``value`` holds that may itself read; records ``value`` as a reader where it may be one."""
        if isinstance(value, Source):
            self.sources.append(value)  # a daskstream source names its place
            return
        if isinstance(value, np.ndarray):
            if isinstance(value, np.memmap) or value.dtype.hasobject:
                if value.dtype.hasobject and value.size <= _MOST_ELEMENTS:
                    yield from value.ravel().tolist()
                elif not value.dtype.hasobject:
                    return  # a memory map reads a local file, which no object store holds
                else:
                    self.found.append(f"numpy.ndarray of {value.size:,} Python objects")
            return
        if hasattr(value, "__dask_graph__"):
            self.graph(value.__dask_graph__())
            return
        if isinstance(value, task_spec.Task):
            yield value.func
            yield from value.args
            yield from value.kwargs.values()
            return
        if isinstance(value, task_spec.DataNode):
            yield value.value
            return
        if isinstance(value, (list, tuple, set, frozenset)):
            yield from value
            return
        if isinstance(value, dict):
            yield from value.keys()
            yield from value.values()
            return
        if isinstance(value, functools.partial):
            yield value.func
            yield from value.args
            yield from value.keywords.values()
            return
        if isinstance(value, types.MethodType):
            yield value.__func__
            yield value.__self__
            return
        if isinstance(value, (types.BuiltinFunctionType, types.MethodWrapperType)):
            owner = getattr(value, "__self__", None)
            if owner is not None and not isinstance(owner, types.ModuleType):
                yield owner  # a bound method of an object in C: the object is what reads
            return
        if isinstance(value, types.FunctionType):
            yield from _held_by_function(value)
            return
        if _of_computing_library(value):
            yield from _attributes(value)
            return
        self.found.append(_described(value))


def _held_by_function(function: types.FunctionType) -> Iterator[Any]:
    """The objects a function holds: its closure's cells, its defaults, and the globals its code names."""
    for cell in function.__closure__ or ():
        try:
            yield cell.cell_contents
        except ValueError:
            continue  # an empty cell
    yield from function.__defaults__ or ()
    yield from (function.__kwdefaults__ or {}).values()
    module = function.__globals__.get("__name__", "")
    if isinstance(module, str) and module.split(".")[0] in ("daskstream", *_COMPUTING_LIBRARIES):
        return  # their own code, whose globals are their modules' functions and constants
    for name in _names_used(function.__code__):
        if name in function.__globals__:
            yield function.__globals__[name]


def _names_used(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _names_used(constant)


def _of_computing_library(value: Any) -> bool:
    module = type(value).__module__ or ""
    return module.split(".")[0] in _COMPUTING_LIBRARIES or module.startswith("daskstream.")


def _attributes(value: Any) -> Iterator[Any]:
    yield from getattr(value, "__dict__", {}).values()
    for name in getattr(type(value), "__slots__", ()):
        if isinstance(name, str) and hasattr(value, name):
            yield getattr(value, name)


def _described(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"
