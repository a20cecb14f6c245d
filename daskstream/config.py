"""daskstream settings inside ``dask.config``.

Defaults live in ``daskstream.yaml`` beside this module and can be overridden
like any dask setting: a YAML file in ``~/.config/dask/``, an environment
variable such as ``DASK_DASKSTREAM__MEMORY_BUDGET=4GiB``, or
``dask.config.set({"daskstream.memory-budget": "4GiB"})``.
"""

from __future__ import annotations

import functools
import pathlib
import re
from collections.abc import Mapping
from typing import Any

import dask.config
import yaml

from daskstream.documents import read_yaml
from daskstream.errors import InvalidArgumentError

_DEFAULTS_PATH = pathlib.Path(__file__).with_name("daskstream.yaml")

# Read like every YAML file daskstream reads: as bounded, plain data.
DEFAULTS: dict[str, Any] = read_yaml(_DEFAULTS_PATH, what="daskstream's default settings", hint="reinstall daskstream")

dask.config.update_defaults(DEFAULTS)

_MISSING = object()


def get(key: str, value: Any = None) -> Any:
    """Return ``value`` when given, else the setting ``daskstream.<key>``.

    The one place where an explicit argument wins over configuration.

    Examples
    --------
    >>> get("planning.float64-copies")
    3
    >>> get("planning.float64-copies", 2)
    2
    """
    if value is not None:
        return value
    return dask.config.get(f"daskstream.{key}")


_SCHEMA_PATH = pathlib.Path(__file__).with_name("daskstream-schema.yaml")
_TYPES = {"integer": "a whole number", "number": "a number", "boolean": "true or false", "string": "text"}


def setting(key: str, value: Any = None) -> Any:
    """``get(key, value)``, checked against the schema and coerced to its type: the one place settings are typed.

    A number given as text (``"5"`` written in quotes in a YAML file) is converted; anything that is
    not of the schema's type, or is outside its ``minimum``/``maximum``, is an
    :class:`~daskstream.errors.InvalidArgumentError` naming the setting.

    Examples
    --------
    >>> setting("planning.float64-copies")
    3
    >>> setting("planning.machine-memory-fraction", "0.5")
    0.5
    """
    raw = get(key, value)
    spec = _schema_entry(key)
    kinds = spec.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    checked = _typed(raw, kinds)
    # A pattern names the only text a setting takes beside its numbers ("auto"): said so when refused.
    pattern = spec.get("pattern")
    if checked is _MISSING or (isinstance(checked, str) and pattern and not re.fullmatch(pattern, checked)):
        wanted = " or ".join(
            repr(pattern.strip("^$")) if kind == "string" and pattern else _TYPES.get(kind, str(kind)) for kind in kinds
        )
        raise _bad(key, raw, wanted)
    if isinstance(checked, (int, float)) and not isinstance(checked, bool):
        low, high = spec.get("minimum"), spec.get("maximum")
        above = spec.get("exclusiveMinimum")
        if (
            (low is not None and checked < low)
            or (high is not None and checked > high)
            or (above is not None and checked <= above)
        ):
            bounds = ", ".join(
                text
                for text in (
                    f"at least {low}" if low is not None else "",
                    f"more than {above}" if above is not None else "",
                    f"at most {high}" if high is not None else "",
                )
                if text
            )
            raise _bad(key, raw, bounds)
    return checked


def _typed(value: Any, kinds: list[str]) -> Any:
    if "null" in kinds and value is None:
        return None
    if "boolean" in kinds and isinstance(value, bool):
        return value
    if isinstance(value, bool):
        return _MISSING
    if "integer" in kinds:
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            return int(value)
    if "number" in kinds:
        if isinstance(value, (int, float)):
            return float(value) if "integer" not in kinds else value
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                number = None
            if number is not None and number == number and abs(number) != float("inf"):
                return number
    if "string" in kinds and isinstance(value, str):
        return value
    return _MISSING


def _bad(key: str, value: Any, wanted: str) -> Exception:

    variable = "DASK_DASKSTREAM__" + key.upper().replace(".", "__").replace("-", "_")
    return InvalidArgumentError(
        f"daskstream.{key} is {value!r}, which must be {wanted}; correct it in your dask configuration (or {variable})"
    )


@functools.cache
def _schema() -> dict[str, Any]:
    # daskstream's own file, not a user's: parsed by libyaml where PyYAML has it (a tenth of the time of the
    # bounded pure-Python reader user files go through, which a process's first setting would wait for).
    loader = getattr(yaml, "CSafeLoader", None)
    if loader is None:  # pragma: no cover - PyYAML built without libyaml
        return read_yaml(_SCHEMA_PATH, what="daskstream's settings schema", hint="reinstall daskstream")
    return yaml.load(_SCHEMA_PATH.read_text(encoding="utf-8"), Loader=loader)


def check_section(values: Mapping[str, Any], *, where: str) -> None:
    """Check settings written under ``daskstream:`` (in a cluster file, say) against the schema.

    The schema that documents ``daskstream.yaml`` is the one checked against
    (with jsonschema): every value of the type and within the bounds it names.

    Raises
    ------
    InvalidArgumentError
        Naming the first setting that is wrong, what it must be, and ``where`` it was written.

    Examples
    --------
    >>> check_section({"planning": {"max-tasks": 1000}}, where="example.yaml")
    >>> check_section({"planning": {"max-tasks": "many"}}, where="example.yaml")
    Traceback (most recent call last):
    ...
    daskstream.errors.InvalidArgumentError: example.yaml: daskstream.planning.max-tasks is 'many', which is not 'auto' nor a number; correct it
    >>> check_section({"planning": {"float64-copies": "x"}}, where="example.yaml")
    Traceback (most recent call last):
    ...
    daskstream.errors.InvalidArgumentError: example.yaml: daskstream.planning.float64-copies is 'x', which is not of type 'integer'; correct it
    """
    errors = sorted(_validator().iter_errors(dict(values)), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        first = errors[0]
        key = ".".join(["daskstream", *map(str, first.absolute_path)])
        if first.validator == "pattern":
            # jsonschema says the text does not match a regular expression; the pattern names the text allowed.
            reason = f"not {first.validator_value.strip('^$')!r} nor a number"
        else:
            reason = first.message.split(" is ", 1)[1] if " is " in first.message else first.message
        raise InvalidArgumentError(f"{where}: {key} is {first.instance!r}, which is {reason}; correct it")


@functools.cache
def _validator() -> Any:
    import jsonschema

    section = _schema()["properties"]["daskstream"]
    validator_class = jsonschema.validators.validator_for(section)
    validator_class.check_schema(section)
    return validator_class(section)


def _schema_entry(key: str) -> dict[str, Any]:
    node = _schema()["properties"]["daskstream"]
    for part in key.split("."):
        node = node["properties"][part]
    return node
