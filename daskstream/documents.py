"""Reading YAML settings files as plain data, within bounds.

Every YAML file daskstream reads goes through :func:`read_yaml`. It reads
the file the way :func:`yaml.safe_load` does (no ``!!python`` tags, so no
object of the file's choosing is ever built) and also refuses what would
otherwise exhaust this process or hide a setting from someone reviewing the
file:

- files larger than ``max_bytes`` and files that are not regular files;
- text that is not UTF-8;
- more than one document in the file;
- nesting deeper than ``max_depth``, counted through aliases, so that
  ``[[[[...]]]]`` and chains of anchors fail here instead of as a
  ``RecursionError`` later;
- anchors and aliases that expand to more than ``max_nodes`` values or
  ``max_bytes`` characters (the "billion laughs": nine aliases of nine
  aliases of ... read as a few lines, then take hours and all memory to
  walk or to write out), or that refer to themselves;
- the same key twice in one mapping (YAML forbids it, and a later copy would
  silently replace the one a reader saw first);
- values that are not plain data: ``!!binary``, ``!!set``, ``!!omap``,
  ``!!pairs`` and unknown tags. Dates and times stay the text they were
  written as.

Every refusal is one line naming the file, and the line and column where
there is one.

>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp(), "settings.yaml")
>>> _ = path.write_text("a: &x [1, 2]\\nb: *x\\nwhen: 2024-01-31\\n")
>>> read_yaml(path, what="settings file")
{'a': [1, 2], 'b': [1, 2], 'when': '2024-01-31'}
>>> _ = path.write_text("a: 1\\na: 2\\n")
>>> read_yaml(path, what="settings file")
Traceback (most recent call last):
...
daskstream.errors.InvalidArgumentError: settings file ... sets 'a' twice (at line 1, column 1 and at line 2, column 1); keep one of them
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from daskstream.errors import (
    ConfigFileNotFoundError,
    CorruptSourceError,
    InvalidArgumentError,
    NotARegularFileError,
    SourcePermissionError,
)
from daskstream.files import open_regular

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "read_yaml"]

# A settings file is a few hundred bytes and a few dozen values nested a few levels deep;
# these bounds leave ample room for that and none for documents built to exhaust a reader.
MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_NODES = 10_000

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(yaml.YAMLError):
    """A document this reader will not build: what is wrong, where, and what to do."""

    def __init__(self, problem: str, note: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.note = note


def read_yaml(
    path: str | os.PathLike[str],
    *,
    what: str,
    hint: str = "correct the file",
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
) -> Any:
    """The one YAML document in ``path``, as plain Python data (``None`` for an empty file).

    Parameters
    ----------
    path
        The file to read.
    what
        What the file is, for messages: ``"cluster configuration"`` gives
        ``"cluster configuration /path/x.yaml is not valid YAML: ..."``.
    hint
        What to do about a file that is not valid YAML, ending such messages.
    max_bytes, max_depth, max_nodes
        The largest file (and most characters, aliases expanded), the deepest
        nesting and the most values (aliases counted as often as they are
        used) that are read.

    Returns
    -------
    Mappings, lists, strings, numbers, booleans and ``None``, as
    :func:`yaml.safe_load` gives them, except that dates and times stay text.

    Raises
    ------
    ConfigFileNotFoundError
        ``path`` does not exist.
    SourcePermissionError
        ``path`` cannot be read.
    CorruptSourceError
        Reading ``path`` failed (an I/O error).
    InvalidArgumentError
        ``path`` is not a regular file, is too large, is not UTF-8, is not
        valid YAML, or breaks one of the bounds above.
    """
    path = Path(path)
    name = f"{what} {path}"
    data = _read_bytes(path, name, max_bytes)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, column = _line_column(data, exc.start)
        raise InvalidArgumentError(
            f"{name} is not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}, column {column}); save it as UTF-8"
        ) from None
    loader = None
    try:
        # The reader checks every character as it is built: that can refuse the text too.
        # Expanded text beyond what the file itself may hold can only come of aliases.
        loader = _BoundedLoader(text, max_depth=max_depth, max_nodes=max_nodes, max_chars=max_bytes)
        return loader.get_single_data()
    except _Refused as exc:
        raise InvalidArgumentError(f"{name} {exc.problem}; {exc.note}") from None
    except yaml.reader.ReaderError as exc:
        line, column = _line_column(text, exc.position)
        raise InvalidArgumentError(
            f"{name} holds a character YAML does not allow (#x{exc.character:04x} at line {line}, column {column}); "
            f"{hint}"
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = ", ".join(part for part in (exc.context, exc.problem) if part) or "unreadable"
        raise InvalidArgumentError(f"{name} is not valid YAML: {problem}{_where(mark)}; {hint}") from None
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(f"{name} is not valid YAML: {_one_line(str(exc))}; {hint}") from None
    except RecursionError:
        # The bounds above stop deep documents first; this is the backstop should a smaller stack run out.
        raise InvalidArgumentError(
            f"{name} nests too deeply to be read; a settings file needs a few levels at most"
        ) from None
    finally:
        if loader is not None:
            loader.dispose()


def _read_bytes(path: Path, name: str, max_bytes: int) -> bytes:
    try:
        with open_regular(os.fspath(path)) as f:
            data = f.read(max_bytes + 1)
    except IsADirectoryError:
        raise InvalidArgumentError(f"{name} is a directory, not a YAML file") from None
    except NotARegularFileError:
        # A pipe or a device could block the read or never end.
        raise InvalidArgumentError(f"{name} is not a regular file; give the path of a YAML file") from None
    except FileNotFoundError:
        raise ConfigFileNotFoundError(f"{name} does not exist") from None
    except (PermissionError, SourcePermissionError):
        raise SourcePermissionError(f"{name} cannot be read (permission denied); check its permissions") from None
    except OSError as exc:
        raise CorruptSourceError(f"{name} could not be read ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise InvalidArgumentError(
            f"{name} is larger than {max_bytes:,} bytes, more than a settings file ever needs; "
            "give the YAML file of settings itself"
        )
    return data


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that counts what aliases expand to and how deep documents nest."""

    def __init__(self, text: str, *, max_depth: int, max_nodes: int, max_chars: int) -> None:
        super().__init__(text)
        self._max_depth = max_depth
        self._max_nodes = max_nodes
        self._max_chars = max_chars
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        # Composing recurses once per level: stop before the interpreter's stack does.
        self._depth += 1
        try:
            if self._depth > self._max_depth:
                raise _Refused(
                    f"nests deeper than {self._max_depth} levels at {_place(self.peek_event().start_mark)}",
                    "a settings file needs a few levels at most",
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        # PyYAML composes a node for every document it is asked for; only its stubs allow None.
        if node is not None:
            _check_expansion(node, max_depth=self._max_depth, max_nodes=self._max_nodes, max_chars=self._max_chars)
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        if isinstance(node, MappingNode):
            seen: dict[Any, Node] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node)
                first = seen.setdefault(key, key_node)
                if first is not key_node:
                    raise _Refused(
                        f"sets {key!r} twice (at {_place(first.start_mark)} and at {_place(key_node.start_mark)})",
                        "keep one of them",
                    )
        return super().construct_mapping(node, deep=deep)


def _not_plain_data(loader: _BoundedLoader, node: Node) -> Any:
    raise _Refused(
        f"holds a value tagged {node.tag!r} at {_place(node.start_mark)}",
        "settings are mappings, lists, text, numbers and booleans only",
    )


def _as_written(loader: _BoundedLoader, node: ScalarNode) -> str:
    return loader.construct_scalar(node)


# Dates stay the text written (dask's settings are text, numbers and booleans); the other
# types are not settings at all.
_BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp", _as_written)
for _tag in ("binary", "set", "omap", "pairs"):
    _BoundedLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _not_plain_data)
_BoundedLoader.add_constructor(None, _not_plain_data)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expansion(root: Node, *, max_depth: int, max_nodes: int, max_chars: int) -> None:
    """Refuse a document whose aliases expand beyond the bounds, or refer to themselves.

    An alias is the very node it names, so the composed document is a graph:
    each node's expanded size (values and characters) and depth are worked out
    once, bottom up, and the expansion itself never happens. Iterative, so that
    a chain of thousands of aliases cannot exhaust the stack either.
    """
    size: dict[int, tuple[int, int, int]] = {}  # id -> (values, characters, depth) once expanded
    started: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children = _children(node)
        if children_done:
            started.discard(key)
            values = 1 + sum(size[id(child)][0] for child in children)
            chars = (len(node.value) if isinstance(node, ScalarNode) else 0) + sum(size[id(c)][1] for c in children)
            depth = 1 + max((size[id(child)][2] for child in children), default=0)
            size[key] = (values, chars, depth)
            if values > max_nodes or chars > max_chars:
                much = f"{max_nodes:,} values" if values > max_nodes else f"{max_chars:,} characters"
                raise _Refused(
                    f"expands to more than {much} through the aliases at {_place(node.start_mark)}",
                    "write the settings out without anchors and aliases",
                )
            if depth > max_depth:
                raise _Refused(
                    f"nests deeper than {max_depth} levels through the aliases at {_place(node.start_mark)}",
                    "a settings file needs a few levels at most",
                )
            continue
        if key in size:
            continue
        started.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in started:
                raise _Refused(
                    f"holds an alias that refers to itself at {_place(child.start_mark)}",
                    "write the settings out without anchors and aliases",
                )
            if id(child) not in size:
                stack.append((child, False))


def _place(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _where(mark: Any) -> str:
    return "" if mark is None else f" at {_place(mark)}"


def _line_column(data: bytes | str, offset: int) -> tuple[int, int]:
    if isinstance(data, bytes):
        newlines, line_start = data.count(b"\n", 0, offset), data.rfind(b"\n", 0, offset) + 1
    else:
        newlines, line_start = data.count("\n", 0, offset), data.rfind("\n", 0, offset) + 1
    return newlines + 1, offset - line_start + 1


def _one_line(text: str) -> str:
    return " ".join(text.split())
