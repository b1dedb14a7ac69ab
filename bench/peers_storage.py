"""Checkpoint storage at a cloud's ratio: an S3 bucket on the gateway, behind each instance's link.

On a cloud, checkpoints go to an object store (S3, GCS) through the instance's network card: what
limits writing or reading one is the instance's share of its link, plus a request's latency. The
pipeline regime keeps that: an S3 server (moto's, the real S3 HTTP API) listens on the hosts'
gateway, outside every instance, so a checkpoint written or read crosses the instance's
``tc``-shaped link beside its training traffic. Every system's checkpoints go there (liveput's
through :mod:`liveput.objectstore`, the FSDP peer's DCP through fsspec on the same), each run
under its own prefix.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from liveput.objectstore import S3FileSystem
from liveput.testbed.aws_endpoint import aws_endpoint

BUCKET = "peers"
_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "peers",
    "AWS_SECRET_ACCESS_KEY": "peers",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextlib.contextmanager
def object_store(address: str, log_dir: Path) -> Iterator[str]:
    """An S3 server on ``address`` (its log under ``log_dir``) with an empty bucket; meanwhile
    this process's environment, which every process it starts inherits, points boto3 at it.
    Yields the bucket's URL."""
    import boto3

    log_dir.mkdir(parents=True, exist_ok=True)
    with aws_endpoint(log_dir / "object-store.log", host=address) as endpoint:
        settings = {**_CREDENTIALS, "AWS_ENDPOINT_URL_S3": endpoint}
        saved = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        S3FileSystem.clear_instance_cache()
        try:
            boto3.session.Session().client("s3").create_bucket(Bucket=BUCKET)
            yield f"s3://{BUCKET}"
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            S3FileSystem.clear_instance_cache()
