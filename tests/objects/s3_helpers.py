"""An S3 API on 127.0.0.1 for tests and benchmarks: moto's server in a process of its own, and its counter."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

from reaper import reaped, released

SERVER = Path(__file__).with_name("s3_server.py")


class S3:
    """The server's endpoint, the options that reach it, and its request counter."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        # No credentials here: they come from the environment, as on a worker.
        self.options = {"client_kwargs": {"endpoint_url": endpoint}}
        self._fs = None

    @property
    def fs(self):
        """An s3fs filesystem for the server, its listings not cached (one for all: a filesystem let go closes
        its connections only when collected, which aiohttp warns of)."""
        import s3fs

        if self._fs is None:
            self._fs = s3fs.S3FileSystem(**self.options)
        self._fs.invalidate_cache()
        return self._fs

    def bucket(self) -> str:
        """A new, empty bucket; its name."""
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.fs.call_s3("create_bucket", Bucket=name)
        return name

    def requests(self) -> dict[str, int]:
        """Requests counted since the last :meth:`reset`, by kind (GET, HEAD, PUT, LIST, DELETE...)."""
        with urllib.request.urlopen(f"{self.endpoint}/_requests") as response:
            return json.loads(response.read())

    def most_gets_at_once(self) -> int:
        """The most GETs the server was answering at once since the last :meth:`reset`."""
        with urllib.request.urlopen(f"{self.endpoint}/_at_once") as response:
            return int(json.loads(response.read()))

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/_requests", method="DELETE")).close()


def start_s3_server(latency: float = 0.0) -> tuple[subprocess.Popen, str]:
    """Start the server on a free port of 127.0.0.1; the process and its endpoint URL."""
    # In a process group of its own, which the reaper ends if this test process dies (see tests/reaper.py).
    proc = reaped(
        [sys.executable, str(SERVER), "0", "--latency", str(latency)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    port = proc.stdout.readline().strip()
    if not port.isdigit():
        proc.kill()
        proc.stdout.close()
        raise RuntimeError(f"the S3 server did not start (it printed {port!r})")
    return proc, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def running_s3_server(latency: float = 0.0):
    """A server (see :func:`start_s3_server`) while the block runs, stopped after it."""
    proc, endpoint = start_s3_server(latency)
    try:
        yield S3(endpoint)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        released(proc)
