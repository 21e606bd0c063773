"""Storage backends for the storage test suite: a local folder, and an S3-compatible server
(moto's server mode) started on loopback for the whole session.

The S3 credentials and endpoint reach the store as storage options registered for the test
bucket's URL only (`storage.store.register_storage_options`), never as environment variables, so
no other test sees them; the server listens on 127.0.0.1 and nothing else is contacted.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from lexiflow.storage.files import register_storage_options

BACKENDS = ["local", "s3"]


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str
    options: dict[str, Any]

    def new_url(self) -> str:
        return f"s3://{self.bucket}/{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[S3Server]:
    """A moto S3 server on 127.0.0.1 (a free port) with one bucket, for the session."""
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    # A region other than us-east-1: s3fs then sends a location constraint moto accepts.
    options = {"key": "lexiflow-test", "secret": "lexiflow-test", "endpoint_url": f"http://{host}:{port}",
               "client_kwargs": {"region_name": "eu-west-1"}}
    bucket = f"lexiflow-test-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(skip_instance_cache=True, **options).mkdir(bucket)
    register_storage_options(f"s3://{bucket}", options)
    try:
        yield S3Server(f"http://{host}:{port}", bucket, options)
    finally:
        register_storage_options(f"s3://{bucket}", None)
        server.stop()


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path) -> str:
    """The name of the storage backend a test runs against: every storage test runs on both."""
    return request.param


@pytest.fixture
def store_url(request, backend, tmp_path) -> str:
    """A fresh, empty store URL on the test's backend: a local folder or a new S3 prefix."""
    if backend == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("moto_s3").new_url()
