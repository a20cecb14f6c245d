"""Stable identities for sources: equal for unchanged data, new once it is rewritten."""

from __future__ import annotations

import hashlib


def source_token(fmt: str, path: str, *stamp: object, dataset: str | None = None) -> str:
    """Hash the format, path, file stamp (size, mtime...) and dataset into a hex token.

    >>> source_token("npy", "/data/a.npy", 128, 1700000000000000000)[:4]
    'npy-'
    >>> source_token("npy", "/data/a.npy", 128, 1) == source_token("npy", "/data/a.npy", 128, 2)
    False
    """
    text = "\x00".join(str(part) for part in (fmt, path, dataset, *stamp))
    return f"{fmt}-{hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()}"
