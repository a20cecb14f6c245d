"""A Zarr array's codecs as its metadata states them: their names, their settings, and the one missing here.

Format 2 names numcodecs' filters and compressor, format 3 its codecs (a
sharding codec's inner codecs after it); :func:`codec_names` and
:func:`codec_configs` read both alike. A codec the metadata names that this
installation cannot decode is found in zarr's or numcodecs' error, with the
package that provides it where known.
"""

from __future__ import annotations

import re
from typing import Any

# How zarr (format 3) and numcodecs (format 2) say that a codec named in the metadata is not registered,
# and how some numcodecs releases say that the package behind a registered codec is missing.
_UNAVAILABLE_CODEC = re.compile(r"(?:Unknown codec|codec not available):? '+(?P<codec>[^']+)'+")
_CODEC_PACKAGE_MISSING = re.compile(r"(?P<package>[\w.-]+) must be installed to use the (?P<codec>\w+) codec")


# numcodecs codecs that exist only beside a package of their own.
_CODEC_PACKAGES = {"zfpy": "zfpy", "pcodec": "pcodec", "crc32c": "crc32c", "msgpack2": "msgpack"}


def _unavailable_codec(exc: BaseException | None) -> tuple[str, str | None] | None:
    """The codec a metadata error says is not available here, and the package it needs where known."""
    while exc is not None:
        found = _UNAVAILABLE_CODEC.search(str(exc))
        if found:
            codec = found.group("codec")
            return codec, _CODEC_PACKAGES.get(codec.removeprefix("numcodecs."))
        found = _CODEC_PACKAGE_MISSING.search(str(exc))
        if found:
            return found.group("codec"), found.group("package")
        exc = exc.__cause__ or exc.__context__
    return None


def codec_configs(array: Any) -> tuple[dict[str, Any], ...]:
    """The settings of each codec that turns a chunk's values into bytes, as the metadata states them
    (format 2: numcodecs' configurations, ``id`` first; format 3: ``name`` and ``configuration``,
    a sharding codec's inner codecs after it)."""
    meta = array.metadata
    if meta.zarr_format == 2:
        parts = [*(meta.filters or ()), meta.compressor]
        return tuple(dict(p.get_config()) for p in parts if p is not None and hasattr(p, "get_config"))
    found: list[dict[str, Any]] = []
    for codec in meta.codecs:
        found.append(dict(codec.to_dict()))
        found.extend(dict(c.to_dict()) for c in getattr(codec, "codecs", None) or ())
    return tuple(found)


def codec_names(array: Any) -> tuple[str, ...]:
    meta = array.metadata
    if meta.zarr_format == 2:
        parts = [*(meta.filters or ()), meta.compressor]
        return tuple(p.codec_id if hasattr(p, "codec_id") else type(p).__name__ for p in parts if p is not None)
    names = []
    for codec in meta.codecs:
        names.append(type(codec).__name__.removesuffix("Codec").lower())
        inner = getattr(codec, "codecs", None)
        if inner:
            names.extend(type(c).__name__.removesuffix("Codec").lower() for c in inner)
    return tuple(names)
