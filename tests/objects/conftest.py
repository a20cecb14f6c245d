"""A real S3 API on 127.0.0.1 (moto's server, in a process of its own) and buckets in it."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("s3fs", reason="object store tests need s3fs (in the test extra)")
pytest.importorskip("moto.moto_server.werkzeug_app", reason="object store tests need moto[server] (in the test extra)")

from s3_helpers import running_s3_server


@pytest.fixture(scope="session")
def s3_credentials():
    """Credentials for the servers below in this process's environment (and its children's)."""
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED")
    saved = {k: os.environ.get(k) for k in names}
    # Without credentials botocore would ask the instance metadata service, off this machine: never here.
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def s3(s3_credentials):
    """moto's S3 server on 127.0.0.1, with credentials in this process's environment (and its children's)."""
    with running_s3_server() as server:
        yield server
