"""What a user sees when an object store cannot be used: one line naming the URL and what to do, in bounded time."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import dask.array as da
import pytest

import daskstream as ds
from daskstream.errors import (
    DaskstreamError,
    ObjectStoreCredentialsError,
    ObjectStoreUnreachableError,
    SourceNotFoundError,
    SourcePermissionError,
)


@pytest.fixture(scope="module")
def stored(s3):
    """A bucket holding one small Zarr array."""
    bucket = s3.bucket()
    ds.store(da.ones(10, chunks=5), f"s3://{bucket}/a.zarr", storage_options=s3.options)
    return bucket


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cases(s3, bucket):
    """(id, URL, storage options, error class, what the message says)."""
    return [
        (
            "unreachable endpoint",
            f"s3://{bucket}/a.zarr",
            {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{_closed_port()}"}},
            ObjectStoreUnreachableError,
            "could not be reached",
        ),
        ("missing bucket", "s3://no-such-bucket/a.zarr", s3.options, SourceNotFoundError, "bucket 'no-such-bucket'"),
        (
            "refused credentials",
            f"s3://{bucket}/a.zarr",
            {**s3.options, "key": "invalid", "secret": "x"},
            ObjectStoreCredentialsError,
            "no valid credentials",
        ),
        (
            "denied access",
            f"s3://{bucket}/a.zarr",
            {**s3.options, "key": "denied", "secret": "x"},
            SourcePermissionError,
            "access denied",
        ),
    ]


CASE_IDS = ["unreachable endpoint", "missing bucket", "refused credentials", "denied access"]


@pytest.mark.parametrize("case", range(len(CASE_IDS)), ids=CASE_IDS)
@pytest.mark.parametrize("doing", ["open", "store"])
def test_each_failure_is_one_clear_line_within_seconds(s3, stored, case, doing):
    _, url, options, error, says = _cases(s3, stored)[case]
    started = time.monotonic()

    def attempt():
        if doing == "open":
            return ds.open(url, storage_options=options)
        return ds.store(da.zeros(10, chunks=5), url.replace("a.zarr", "new.zarr"), storage_options=options)

    with pytest.raises(error, match=says) as caught:
        attempt()
    # A connect timeout and a bounded number of tries, not botocore's default minutes.
    assert time.monotonic() - started < 15
    message = str(caught.value)
    assert "\n" not in message
    assert url.split("/")[2] in message  # names the bucket the user gave
    assert isinstance(caught.value, DaskstreamError)


def test_missing_credentials_say_where_to_put_them(s3, stored, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(ObjectStoreCredentialsError, match=r"AWS_ACCESS_KEY_ID.*as storage_options, or anon=True"):
        # Options of their own: this process's filesystem for the usual ones holds the earlier credentials.
        ds.open(f"s3://{stored}/a.zarr", storage_options={**s3.options, "config_kwargs": {"user_agent_extra": "none"}})
    # The command names its own flag for them.
    option = ["--storage-option", f"client_kwargs.endpoint_url={s3.endpoint}"]
    run = subprocess.run(
        [sys.executable, "-m", "daskstream", "info", f"s3://{stored}/a.zarr", *option],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"},
    )
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert "AWS_ACCESS_KEY_ID" in line, line
    assert "as --storage-option, or anon=True" in line, line
    assert "storage_options" not in line


def test_a_url_with_nothing_there_is_not_found(s3, stored):
    with pytest.raises(SourceNotFoundError, match=r"nothing\.zarr"):
        ds.open(f"s3://{stored}/nothing.zarr", storage_options=s3.options)


@pytest.mark.parametrize("command", ["info", "store"])
def test_the_cli_prints_one_line_and_exits_2(s3, stored, command, tmp_path):
    port = _closed_port()
    option = ["--storage-option", f"client_kwargs.endpoint_url=http://127.0.0.1:{port}"]
    if command == "info":
        args = ["info", f"s3://{stored}/a.zarr", *option]
    else:
        import numpy as np

        np.save(tmp_path / "a.npy", np.zeros(10))
        args = ["store", str(tmp_path / "a.npy"), f"s3://{stored}/b.zarr", *option, "--quiet"]
    run = subprocess.run([sys.executable, "-m", "daskstream", *args], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "could not be reached" in lines[0]
    assert f"127.0.0.1:{port}" in lines[0]
    assert "Traceback" not in run.stderr


def test_a_storage_option_that_is_not_key_value_is_a_usage_error():
    run = subprocess.run(
        [sys.executable, "-m", "daskstream", "info", "s3://b/a.zarr", "--storage-option", "anon"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "KEY=VALUE" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
