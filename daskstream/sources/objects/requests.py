"""Concurrent GETs of whole objects or byte ranges on fsspec's event loop, each with the version it came with.

S3 goes through s3fs's client directly: a GET with no HEAD before it, the
ETag and the object's size taken from the response, retried as s3fs retries.
s3fs's public ``cat_file`` returns the bytes alone, so the version would come
from another request (``info``), which a write between the two makes wrong:
the bytes of one write recorded under the version of another. Its client call
(``_call_s3``) is the one s3fs's own ``cat_file`` makes.
Other asynchronous filesystems (GCS, Azure, HTTP...) use their own
``_cat_file``; synchronous ones are read one request after another.

Requests start in the order asked (:class:`Gate`), at most ``limit`` at once
and, where their sizes are known, at most ``most_bytes`` on their way at
once (always one): a reader decoding objects in that order finds the first
ones arrived early, while the rest are on their way, rather than every
object arriving at the end of one long shared transfer. Errors are
left as the backends raise them: :class:`daskstream.sources.objects.places.Place`
translates them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

# S3's code for a bucket that does not exist (s3fs raises FileNotFoundError for it and for a missing key).
MISSING_BUCKET_CODES = ("NoSuchBucket",)


@dataclass(frozen=True)
class Got:
    """One object (or a range of it) read: its bytes (``None`` when there is no such object), the version
    the store gave and the whole object's size where the response said it."""

    data: bytes | None
    version: str | None
    size: int | None = None


def run(fs: Any, coroutine: Any) -> Any:
    from fsspec.asyn import sync

    return sync(fs.loop, lambda: coroutine)


# One request: an object's path, and the byte range wanted (``None, None``: all of it).
Request = tuple[str, int | None, int | None]


class Gate:
    """Admits requests in the order of their positions: at most ``limit`` in flight, and no more than
    ``most_bytes`` of known sizes in flight unless nothing else is.

    Each request waits on an event of its own, set when its turn comes: a
    request finishing wakes only those it lets start, however many wait.
    Used on one event loop, whose thread alone changes it.

    Parameters
    ----------
    sizes
        Each request's bytes (``None`` where not known: counted as none).
    """

    def __init__(self, sizes: list[int | None], limit: int, most_bytes: int | None = None) -> None:
        self.sizes = [size or 0 for size in sizes]
        self.limit, self.most_bytes = max(1, limit), most_bytes
        self.turn = self.running = self.bytes = 0
        self.started = [asyncio.Event() for _ in self.sizes]
        self._admit()

    def _admit(self) -> None:
        """Start the requests next in order for as long as they fit."""
        while self.turn < len(self.sizes) and self.running < self.limit:
            size = self.sizes[self.turn]
            if self.running and self.most_bytes is not None and self.bytes + size > self.most_bytes:
                return
            self.running += 1
            self.bytes += size
            self.started[self.turn].set()
            self.turn += 1

    def _leave(self, position: int) -> None:
        self.running -= 1
        self.bytes -= self.sizes[position]
        self._admit()

    @contextlib.asynccontextmanager
    async def admitted(self, position: int) -> AsyncIterator[None]:
        """Wait for the request's turn; what it holds of the bounds is given back when the block ends."""
        started = self.started[position]
        try:
            await started.wait()
        except BaseException:
            if started.is_set():  # cancelled as its turn came: its place is given back
                self._leave(position)
            raise
        try:
            yield
        finally:
            self._leave(position)


def gate_for(
    requests: list[Request], limit: int, most_bytes: int | None, sizes: Sequence[int | None] | None = None
) -> Gate:
    """The :class:`Gate` of ``requests``, each counted as its range's length, else its object's size in
    ``sizes`` where known."""
    whole = sizes if sizes is not None else [None] * len(requests)
    counted = [
        stop - start if start is not None and stop is not None else size
        for (_, start, stop), size in zip(requests, whole)
    ]
    return Gate(counted, limit, most_bytes)


async def s3_get_many(
    fs: Any, requests: list[Request], gate: Gate, arrived: Callable[[tuple[int, Got]], None] | None = None
) -> list[Got]:
    """GET each object or range as ``gate`` admits them; version and size come from each response.

    ``arrived`` is told ``(position, Got)`` of each as it arrives.
    """
    from s3fs.core import _error_wrapper

    async def get(position: int, path: str, start: int | None, stop: int | None) -> Got:
        bucket, key, version = fs.split_path(path)
        extra: dict[str, Any] = {"VersionId": version} if version else {}
        empty = start is not None and stop is not None and stop <= start
        if start is not None and stop is not None and not empty:
            extra["Range"] = f"bytes={start}-{stop - 1}"

        async def call_and_read() -> Got:
            response = await fs._call_s3("get_object", Bucket=bucket, Key=key, **extra, **fs.req_kw)
            try:
                data = await response["Body"].read()
            finally:
                response["Body"].close()
            return Got(data, str(response.get("ETag", "")).strip('"') or None, _whole_size(response, len(data)))

        async with gate.admitted(position):  # its turn taken even when empty: the requests after it wait for it
            if empty:
                return Got(b"", None)
            try:
                return await _error_wrapper(call_and_read, retries=fs.retries)
            except FileNotFoundError as exc:
                # s3fs gives a missing bucket and a missing key the same class; the code it keeps tells them apart.
                if any(code in str(exc.__cause__) for code in MISSING_BUCKET_CODES):
                    raise
                return Got(None, None)

    return await _gathered([get(i, *request) for i, request in enumerate(requests)], arrived)


async def _gathered(gets: list[Any], arrived: Callable[[tuple[int, Got]], None] | None) -> list[Got]:
    """Await every GET, telling ``arrived`` of each one as it lands."""

    async def told(position: int, get: Any) -> Got:
        got = await get
        if arrived is not None:
            arrived((position, got))
        return got

    return list(await asyncio.gather(*(told(i, get) for i, get in enumerate(gets))))


def _whole_size(response: dict[str, Any], received: int) -> int | None:
    """The object's whole size: after the slash of ``Content-Range`` for a ranged GET, else what came."""
    content_range = str(response.get("ContentRange") or "")
    if "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        return int(total) if total.isdigit() else None
    return received


async def async_get_many(
    fs: Any, requests: list[Request], gate: Gate, arrived: Callable[[tuple[int, Got]], None] | None = None
) -> list[Got]:
    """GET each object or range of an asynchronous filesystem (GCS, Azure, HTTP...) without a HEAD first,
    as ``gate`` admits them."""

    async def get(position: int, path: str, start: int | None, stop: int | None) -> Got:
        async with gate.admitted(position):
            try:
                return Got(await fs._cat_file(path, start=start, end=stop), None)
            except FileNotFoundError:
                return Got(None, None)

    return await _gathered([get(i, *request) for i, request in enumerate(requests)], arrived)


def cat_or_none(fs: Any, path: str, start: int | None = None, stop: int | None = None) -> bytes | None:
    try:
        return fs.cat_file(path, start=start, end=stop)
    except FileNotFoundError:
        return None
