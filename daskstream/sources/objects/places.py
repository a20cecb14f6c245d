"""Object stores (S3, GCS, Azure, HTTP, memory...) through fsspec: one place for requests and their errors.

A :class:`Place` is a URL and its fsspec options. It travels in task graphs
without its secrets: keys, tokens and passwords stay in the process that was
given them, and a process that unpickles a place builds its filesystem from
the options that are left, so workers find credentials in their own
environment (``AWS_ACCESS_KEY_ID``..., a profile named with
``profile=``), as the cloud libraries look for them anyway.

Reads come back with the version the store gave the object (S3's ETag, from
the GET response itself: no HEAD per GET), so a reader can tell an object
rewritten since it was listed. A task's objects are fetched concurrently on
fsspec's event loop, a bounded number in flight
(``daskstream.objects.requests-per-task``), over the connections the
filesystem keeps. Every failure leaves here as one :class:`DaskstreamError`
that names the URL and says what to do: unreachable endpoint, missing or
refused credentials, missing bucket or object, denied access.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import posixpath
import queue
from collections.abc import Iterator, Sequence
from typing import Any

from daskstream import config
from daskstream.advice import named, said
from daskstream.errors import (
    DaskstreamError,
    MissingDependencyError,
    ObjectStoreCredentialsError,
    ObjectStoreUnreachableError,
    SourceNotFoundError,
    SourcePermissionError,
    error_chain,
    first_line,
)
from daskstream.planning.budget import parse_budget
from daskstream.sources.handles import cached_handle
from daskstream.sources.objects.requests import (
    MISSING_BUCKET_CODES,
    Got,
    Request,
    async_get_many,
    cat_or_none,
    gate_for,
    run,
    s3_get_many,
)

# Option names that hold secrets, at any depth (client_kwargs, config...): never pickled.
SECRET_OPTIONS = frozenset(
    {
        "key",
        "secret",
        "token",
        "password",
        "access_key",
        "secret_key",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "session_token",
        "account_key",
        "sas_token",
        "connection_string",
        "credential",
        "credentials",
        "client_secret",
    }
)

# Exception class names (of botocore, aiohttp, google-auth, azure) that mean "no usable credentials".
_CREDENTIAL_ERRORS = (
    "NoCredentialsError",
    "PartialCredentialsError",
    "CredentialRetrievalError",
    "ProfileNotFound",
    "DefaultCredentialsError",
    "ClientAuthenticationError",
)
# ...and those that mean the endpoint could not be reached at all.
_UNREACHABLE_ERRORS = (
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ConnectionClosedError",
    "ClientConnectorError",
    "ServerDisconnectedError",
    "ServerTimeoutError",
    "ConnectionRefusedError",
    "ConnectionResetError",
    "TimeoutError",
    "gaierror",
)
# Error codes of S3-compatible stores, as s3fs and botocore report them.
_CREDENTIAL_CODES = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefresh")


def is_url(path: str) -> bool:
    """Whether ``path`` is a URL for fsspec (``s3://...``); a ``file://`` URL is a local path.

    >>> is_url("s3://bucket/a.zarr"), is_url("file:///data/a.zarr"), is_url("/data/a.zarr")
    (True, False, False)
    """
    return "://" in path and not path.startswith("file://")


def public_options(options: Any) -> Any:
    """``options`` without the values of secret-named keys, at any depth.

    >>> public_options({"key": "AKIA", "client_kwargs": {"endpoint_url": "http://s3", "aws_secret_access_key": "x"}})
    {'client_kwargs': {'endpoint_url': 'http://s3'}}
    """
    if isinstance(options, dict):
        return {k: public_options(v) for k, v in options.items() if str(k).lower() not in SECRET_OPTIONS}
    if isinstance(options, list | tuple):
        return type(options)(public_options(v) for v in options)
    return options


def has_secrets(options: Any) -> bool:
    """Whether ``options`` hold a secret anywhere (so a process that unpickles them gets less)."""
    return public_options(options) != options


class Place:
    """A URL on an object store (a bucket, a prefix, or one object) and the fsspec options to reach it.

    Parameters
    ----------
    url
        ``s3://bucket/prefix``, ``gs://...``, ``az://...``, ``http(s)://...``,
        ``memory://...`` or any URL fsspec knows.
    storage_options
        fsspec options (``endpoint_url`` in ``client_kwargs``, ``anon``,
        ``profile``, credentials...). Secret ones stay in this process.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.protocol = url.split("://", 1)[0].lower()

    def __getstate__(self) -> dict[str, Any]:
        # Credentials never travel: a worker uses its own environment, profile or role.
        return {**self.__dict__, "storage_options": public_options(self.storage_options)}

    def __repr__(self) -> str:
        return f"Place({self.url!r})"

    @property
    def fs(self) -> Any:
        """This process's fsspec filesystem for the place, made once per set of options."""
        options = _with_defaults(self.protocol, self.storage_options)
        return cached_handle(("fsspec", self.protocol, _digest(options)), lambda: self._filesystem(options))

    def _filesystem(self, options: dict[str, Any]) -> Any:
        import fsspec

        try:
            cls = fsspec.get_filesystem_class(self.protocol)
        except (ImportError, ValueError) as exc:
            raise MissingDependencyError(
                f"{self.url}: reading {self.protocol}:// URLs needs a package that is not installed ({exc}); "
                + (
                    "pip install 'daskstream[s3]'"
                    if self.protocol in ("s3", "s3a")
                    else "install fsspec's backend for it"
                )
            ) from None
        with self.errors("connect"):
            fs = cls(**options)
        if self.protocol in ("s3", "s3a"):
            # s3fs retries failed requests itself on top of botocore: bound both.
            fs.retries = max(1, int(config.setting("objects.retries")))
        return fs

    @property
    def root(self) -> str:
        """The place's path as its filesystem names it (``bucket/prefix``)."""
        return self.fs._strip_protocol(self.url).rstrip("/")

    def path(self, key: str) -> str:
        """The filesystem path of ``key`` below the place."""
        return posixpath.join(self.root, key) if key else self.root

    def child(self, key: str) -> Place:
        """The place ``key`` below this one, with the same options."""
        return Place(f"{self.url}/{key.strip('/')}", self.storage_options)

    # --- requests ---------------------------------------------------------------------------------

    def get(self, key: str = "") -> Got:
        """The object at ``key`` (``data`` is ``None`` when there is none)."""
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[str], *, what: str = "read") -> list[Got]:
        """The objects at ``keys``, fetched concurrently; a missing one reads as ``Got(None, None)``."""
        if not keys:
            return []
        return self._fetch([(self.path(key), None, None) for key in keys], what)

    def get_each(
        self, keys: Sequence[str], *, what: str = "read", sizes: Sequence[int | None] | None = None
    ) -> Iterator[tuple[int, Got]]:
        """The objects at ``keys`` as each arrives: ``(position in keys, Got)``, fetched concurrently.

        The caller works on one object (decodes it, say) while the others are
        still on their way; leaving the loop early cancels what is left.
        Requests start in the order of ``keys``; where ``sizes`` (each
        object's bytes, as listed) are given, no more than
        ``daskstream.objects.bytes-in-flight`` are on their way at once, so
        the first objects arrive early rather than all at the end.
        """
        if not keys:
            return
        fs = self.fs
        if not (hasattr(fs, "_call_s3") or getattr(fs, "async_impl", False)):
            yield from enumerate(self.get_many(keys, what=what))
            return
        limit, most_bytes = _in_flight()
        requests: list[Request] = [(self.path(key), None, None) for key in keys]
        arrived: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        many = s3_get_many if hasattr(fs, "_call_s3") else async_get_many
        fetching = many(fs, requests, gate_for(requests, limit, most_bytes, sizes), arrived.put)
        running = asyncio.run_coroutine_threadsafe(fetching, fs.loop)

        def failed(done: Any) -> None:
            # A failure ends the gather: say so to the loop below, which would otherwise wait for the rest.
            if not done.cancelled() and done.exception() is not None:
                arrived.put((-1, None))

        running.add_done_callback(failed)
        try:
            with self.errors(what):
                for _ in keys:
                    position, got = arrived.get()
                    if position < 0:
                        running.result()  # raises the failure, translated
                    yield position, got
        finally:
            running.cancel()

    def get_range(self, key: str, start: int, stop: int) -> Got:
        """Bytes ``start:stop`` of the object at ``key`` (one ranged GET), with its version and size."""
        return self.get_ranges(key, [(start, stop)])[0]

    def get_head(self, key: str, n: int) -> Got:
        """The first ``n`` bytes of the object at ``key`` (all of it when shorter), with its version and size.

        One ranged GET. An empty object, which no range fits (S3 answers 416),
        is read whole instead.
        """
        try:
            return self.get_range(key, 0, n)
        except OSError as exc:
            if isinstance(exc, DaskstreamError) or exc.errno != errno.EINVAL:
                raise
        return self.get(key)

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]], *, what: str = "read") -> list[Got]:
        """Bytes ``start:stop`` of the object at ``key`` for each range, fetched concurrently.

        Each :class:`Got` carries the version the response gave (S3's ETag)
        and the object's whole size (from ``Content-Range``), so a caller can
        tell an object rewritten since it was opened without another
        request. A missing object reads as ``Got(None, None)``.
        """
        if not ranges:
            return []
        path = self.path(key)
        return self._fetch([(path, int(start), int(stop)) for start, stop in ranges], what)

    def _fetch(self, requests: list[Request], what: str) -> list[Got]:
        """Each request's object or range, concurrently on the filesystem's loop where it has one."""
        fs = self.fs
        limit, most_bytes = _in_flight()
        with self.errors(what):
            if hasattr(fs, "_call_s3"):
                return run(fs, s3_get_many(fs, requests, gate_for(requests, limit, most_bytes)))
            if getattr(fs, "async_impl", False):
                return run(fs, async_get_many(fs, requests, gate_for(requests, limit, most_bytes)))
            return [Got(cat_or_none(fs, *request), None) for request in requests]

    def put(self, key: str, data: bytes) -> None:
        """Put ``data`` as the object at ``key``, whole: object stores make a PUT atomic."""
        with self.errors("write"):
            self.fs.pipe_file(self.path(key), bytes(data))

    def put_many(self, items: dict[str, bytes]) -> None:
        """Put several objects at once, concurrently."""
        if items:
            with self.errors("write"):
                self.fs.pipe({self.path(key): bytes(data) for key, data in items.items()})

    def delete(self, keys: Sequence[str]) -> None:
        """Remove the objects at ``keys`` (missing ones are fine)."""
        if keys:
            with self.errors("delete"), contextlib.suppress(FileNotFoundError):
                self.fs.rm([self.path(key) for key in keys])

    def delete_tree(self, key: str = "") -> None:
        """Remove every object below ``key``."""
        with self.errors("delete"), contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.path(key), recursive=True)

    def listing(self, key: str = "") -> dict[str, str]:
        """Every object below ``key`` (relative to the place) and its version, from the listing alone."""
        return {name: version_of(info) for name, info in self._listed(key).items()}

    def versions_and_sizes(self, key: str = "") -> tuple[dict[str, str], dict[str, int]]:
        """Every object below ``key`` with its version, and with its size in bytes, from one listing."""
        listed = self._listed(key)
        return (
            {name: version_of(info) for name, info in listed.items()},
            {name: int(info.get("size") or 0) for name, info in listed.items()},
        )

    def sizes(self, key: str = "") -> dict[str, int]:
        """Every object below ``key`` (relative to the place) and its size in bytes, from the listing alone."""
        return {name: int(info.get("size") or 0) for name, info in self._listed(key).items()}

    def _listed(self, key: str) -> dict[str, dict[str, Any]]:
        """What a fresh listing says of every object below ``key``, by its key relative to the place."""
        fs = self.fs
        with self.errors("list"):
            with contextlib.suppress(AttributeError):
                fs.invalidate_cache()
            try:
                found = fs.find(self.path(key), detail=True)
            except FileNotFoundError:
                return {}
        return {posixpath.relpath(path, self.root): info for path, info in found.items()}

    def check_reachable(self) -> None:
        """Raise one clear error now when the place cannot be reached or read (endpoint, credentials, bucket)."""
        fs = self.fs
        bucket, _, prefix = self.root.partition("/")
        # Once per bucket and options in a process: a store opened again, or read after it was detected,
        # costs no request more (a failure later is translated just the same).
        reached = (self.protocol, bucket, _digest(self.storage_options))
        if reached in _reached:
            return
        with self.errors("open"):
            with contextlib.suppress(AttributeError):
                fs.invalidate_cache()
            if self.protocol in ("s3", "s3a"):
                # A listing of at most one key, not a HEAD: its error body names what is wrong (a HEAD's
                # 403 cannot tell refused credentials from denied access).
                try:
                    run(fs, fs._call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix, MaxKeys=1))
                except FileNotFoundError:
                    raise SourceNotFoundError(
                        f"{self._where()}: the bucket {bucket!r} does not exist; check the URL"
                    ) from None
            else:
                fs.exists(self.root)
        _reached.add(reached)

    @contextlib.contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """Turn what fsspec and its backends raise into one-line :class:`DaskstreamError` s."""
        try:
            yield
        except DaskstreamError:
            raise
        except Exception as exc:
            translated = self._translate(exc, doing)
            if translated is None:
                raise
            raise translated from exc

    def _where(self) -> str:
        endpoint = endpoint_of(self.storage_options)
        return f"{self.url}" + (f" (endpoint {endpoint})" if endpoint else "")

    def _translate(self, exc: BaseException, doing: str) -> Exception | None:
        names = {type(e).__name__ for e in error_chain(exc)}
        text = " ".join(str(e) for e in error_chain(exc))
        where = self._where()
        if names & set(_CREDENTIAL_ERRORS) or any(code in text for code in _CREDENTIAL_CODES):
            return ObjectStoreCredentialsError(
                said(
                    f"{where}: no valid credentials to {doing} it ({_first_line(exc)}); give them in the "
                    "environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE), as ",
                    named("storage_options"),
                    ", or anon=True for a public bucket. Workers of a cluster use their own environment: the "
                    "secrets in ",
                    named("storage_options"),
                    " are not sent to them",
                )
            )
        if names & set(_UNREACHABLE_ERRORS):
            return ObjectStoreUnreachableError(
                f"{where}: the object store could not be reached to {doing} it ({_first_line(exc)}); check "
                "the endpoint (client_kwargs.endpoint_url) and the network; daskstream waits "
                f"{config.setting('objects.connect-timeout')} s per connection and tries "
                f"{config.setting('objects.retries')} time(s) (daskstream.objects.connect-timeout, .retries)"
            )
        if any(code in text for code in MISSING_BUCKET_CODES) or "bucket does not exist" in text.lower():
            bucket = self.root.split("/", 1)[0]
            return SourceNotFoundError(f"{where}: the bucket {bucket!r} does not exist; check the URL")
        if isinstance(exc, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
            return SourcePermissionError(
                f"{where}: access denied to {doing} it ({_first_line(exc)}); check the credentials' permissions "
                "on this bucket and prefix"
            )
        if isinstance(exc, FileNotFoundError):
            return SourceNotFoundError(f"{where}: no such object or prefix; check the URL")
        return None


# The buckets (with the options used) this process has reached: see Place.check_reachable.
_reached: set[tuple[str, str, str]] = set()


def _digest(options: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(options, sort_keys=True, default=repr).encode()).hexdigest()


def _in_flight() -> tuple[int, int]:
    """The requests, and the bytes of them, one task keeps on their way at once."""
    limit = max(1, int(config.setting("objects.requests-per-task")))
    return limit, parse_budget(config.setting("objects.bytes-in-flight"), name="daskstream.objects.bytes-in-flight")


def version_of(info: dict[str, Any]) -> str:
    """The version of an object as its listing or response states it: ETag, else generation, else time and size."""
    for name in ("ETag", "etag", "VersionId", "generation", "md5Hash", "content_md5"):
        if info.get(name):
            return str(info[name]).strip('"')
    stamp = [str(info.get(name)) for name in ("LastModified", "last_modified", "updated", "mtime", "created")]
    return f"{info.get('size')}@{'|'.join(stamp)}"


def _with_defaults(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """The user's options, with bounded connection time and retries where the user set none (S3)."""
    if protocol not in ("s3", "s3a"):
        return options
    config_kwargs = dict(options.get("config_kwargs") or {})
    config_kwargs.setdefault("connect_timeout", float(config.setting("objects.connect-timeout")))
    config_kwargs.setdefault("retries", {"max_attempts": int(config.setting("objects.retries")), "mode": "standard"})
    return {**options, "config_kwargs": config_kwargs}


def _first_line(exc: BaseException) -> str:
    """The exception's type and the first line of its message (200 characters at most)."""
    return f"{type(exc).__name__}: {first_line(exc).strip()[:200]}" if str(exc).strip() else type(exc).__name__


def endpoint_of(options: dict[str, Any]) -> str | None:
    """The endpoint URL fsspec options name (``endpoint_url``, at the top or in ``client_kwargs``), if any."""
    client = options.get("client_kwargs") or {}
    return options.get("endpoint_url") or client.get("endpoint_url")
