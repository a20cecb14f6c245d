"""daskstream settings inside ``dask.config``.

Defaults live in ``daskstream.yaml`` beside this module and can be overridden
like any dask setting: a YAML file in ``~/.config/dask/``, an environment
variable such as ``DASK_DASKSTREAM__MEMORY_BUDGET=4GiB``, or
``dask.config.set({"daskstream.memory-budget": "4GiB"})``.
"""

from __future__ import annotations

import pathlib
from typing import Any

import dask.config

from daskstream.runtime.documents import read_yaml

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
