"""An S3 API on 127.0.0.1 for tests and benchmarks: moto's server, with a latency and a request count.

Run as ``python tests/objects/s3_server.py PORT [--latency SECONDS]`` (port 0: any free one); it
prints the port it listens on, then serves until killed. Each request waits
``latency`` before moto answers it, as a store across a network would. ``GET /_requests``
returns the requests counted so far by kind (GET, HEAD, PUT, LIST, DELETE...) as JSON,
``GET /_at_once`` the most GETs of objects it was answering at once, and ``DELETE /_requests``
sets both to zero. A request signed with the access key ``denied``
is refused with S3's AccessDenied, one signed with ``invalid`` with InvalidAccessKeyId:
moto's server checks no credentials, and stores do.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import Counter

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import WSGIRequestHandler, make_server

_REFUSALS = {
    "denied": ("AccessDenied", "Access Denied"),
    "invalid": ("InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."),
}


class Instrumented:
    """WSGI middleware: waits, counts and refuses, then hands the request to moto."""

    def __init__(self, app, latency: float) -> None:
        self.app = app
        self.latency = latency
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.getting = self.most_getting = 0  # GETs being answered now, and the most at once

    def __call__(self, environ, start_response):
        method = environ["REQUEST_METHOD"]
        if environ.get("PATH_INFO") in ("/_requests", "/_at_once"):
            if method == "DELETE":
                with self.lock:
                    self.counts.clear()
                    self.most_getting = 0
            with self.lock:
                said = dict(self.counts) if environ["PATH_INFO"] == "/_requests" else self.most_getting
                body = json.dumps(said).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        path = environ.get("PATH_INFO", "").strip("/")
        # A GET of a bucket (no key after it) is a listing.
        kind = "LIST" if method == "GET" and "/" not in path else method
        with self.lock:
            self.counts[kind] += 1
            if kind == "GET":
                self.getting += 1
                self.most_getting = max(self.most_getting, self.getting)
        try:
            return self._answer(environ, start_response, method)
        finally:
            if kind == "GET":
                with self.lock:
                    self.getting -= 1

    def _answer(self, environ, start_response, method):
        if self.latency:
            time.sleep(self.latency)
        auth = environ.get("HTTP_AUTHORIZATION", "")
        for key, (code, message) in _REFUSALS.items():
            if f"Credential={key}/" in auth:
                body = (
                    f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}'
                    "</Message><RequestId>0</RequestId></Error>"
                ).encode()
                if method == "HEAD":
                    body = b""  # a HEAD response has no body, as S3 sends none
                start_response(
                    "403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))]
                )
                return [body]
        return self.app(environ, start_response)


class _Quiet(WSGIRequestHandler):
    def log_request(self, *args, **kwargs) -> None:
        pass  # a line per request would drown what the tests print


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds each request waits")
    args = parser.parse_args()
    app = Instrumented(DomainDispatcherApplication(create_backend_app), args.latency)
    server = make_server("127.0.0.1", args.port, app, threaded=True, request_handler=_Quiet)
    print(server.port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
