"""``s3://`` checkpoints without s3fs: a small fsspec filesystem on boto3.

Checkpoints, final weights and exports take any fsspec URL. On AWS the natural one is an S3
bucket, but fsspec's own S3 backend (s3fs, on aiobotocore) pins botocore to ranges that exclude
the boto3 liveput pins, so it cannot be installed beside it. :func:`url_to_fs` resolves a URL as
fsspec does, and for ``s3://`` (and ``s3a://``) uses :class:`S3FileSystem` below unless s3fs is
importable (then s3fs, the standard, wins).

S3 has no folders: a "directory" is a key prefix that some object has, ``makedirs`` does nothing
(the bucket must exist: the first write says so, in one line, if it does not), ``mv`` is a
server-side copy and a delete. Credentials, region and endpoint come from boto3's usual chain:
``AWS_ENDPOINT_URL_S3`` points it at any S3-compatible store (MinIO, moto's server).
"""

from __future__ import annotations

import importlib.util
import io
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

PART_BYTES = 64 * 2**20
"""Bytes of each part of a multipart upload (S3's minimum is 5 MiB, except the last part); a
file smaller than this is one PUT."""

_DELETE_BATCH = 1000  # S3's most keys per DeleteObjects request
_REGISTER_LOCK = threading.Lock()


def url_to_fs(url: str) -> tuple[AbstractFileSystem, str]:
    """``fsspec.core.url_to_fs(url)``, with ``s3://`` served by :class:`S3FileSystem` where
    s3fs is not installed."""
    if url.split("://", 1)[0] in S3FileSystem.protocol:
        _register()
    return fsspec.core.url_to_fs(url)


OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})
"""fsspec protocols of object stores: an object appears whole when its upload completes."""


def _protocols(fs: AbstractFileSystem) -> set[str]:
    return {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)


def writes_whole_objects(fs: AbstractFileSystem) -> bool:
    """Whether a file written to ``fs`` appears only once complete (an object store), so that
    writing it aside and renaming it (on S3 a copy of every byte) buys nothing."""
    return bool(_protocols(fs) & OBJECT_STORE_PROTOCOLS)


def local_folder(url: str) -> Path | None:
    """The folder ``url`` names on this machine's file system (None: it is elsewhere, an object
    store's)."""
    fs, root = url_to_fs(url.rstrip("/"))
    return Path(root) if "file" in _protocols(fs) else None


def _register() -> None:
    with _REGISTER_LOCK:
        if importlib.util.find_spec("s3fs") is None:  # else fsspec's own S3 backend serves s3://
            for protocol in S3FileSystem.protocol:
                fsspec.register_implementation(protocol, S3FileSystem, clobber=True)


def _is_missing(error: Exception) -> bool:
    response = getattr(error, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    return code in {"404", "NoSuchKey", "NotFound"}


class S3FileSystem(AbstractFileSystem):
    """Objects of S3 buckets as fsspec files; paths are ``bucket/key`` (or ``s3://bucket/key``)."""

    protocol = ("s3", "s3a")
    root_marker = ""

    def __init__(self, **storage_options: Any) -> None:
        super().__init__(**storage_options)
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The boto3 S3 client, made on first use (boto3's credential and endpoint chain)."""
        if self._client is None:
            import boto3
            from botocore.config import Config

            # No pass over the body before it is sent (a SHA-256 to sign it over plain HTTP, a
            # CRC32 where not required): a checkpoint's upload is paced as it is sent
            # (:class:`Pacer`), and a layer file carries its own signature.
            config = Config(
                request_checksum_calculation="when_required",
                s3={"payload_signing_enabled": False},
            )
            self._client = boto3.session.Session().client("s3", config=config)
        return self._client

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = str(path)
        for protocol in cls.protocol:
            if text.startswith(f"{protocol}://"):
                text = text[len(protocol) + 3 :]
        return text.rstrip("/")

    def split_path(self, path: str) -> tuple[str, str]:
        """(bucket, key) of a path; the key is empty for a bucket itself."""
        bucket, _, key = self._strip_protocol(path).partition("/")
        if not bucket:
            raise ValueError(f"{path}: no bucket in the S3 path")
        return bucket, key

    def _objects(self, bucket: str, prefix: str, delimiter: str = "") -> tuple[list, list]:
        """(objects, common prefixes) under ``prefix``, every page."""
        objects: list = []
        prefixes: list = []
        options = {"Bucket": bucket, "Prefix": prefix}
        if delimiter:
            options["Delimiter"] = delimiter
        for page in self.client.get_paginator("list_objects_v2").paginate(**options):
            objects.extend(page.get("Contents", []))
            prefixes.extend(page.get("CommonPrefixes", []))
        return objects, prefixes

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list:
        bucket, key = self.split_path(path)
        prefix = f"{key}/" if key else ""
        objects, prefixes = self._objects(bucket, prefix, delimiter="/")
        entries = [
            {"name": f"{bucket}/{p['Prefix'].rstrip('/')}", "type": "directory", "size": 0}
            for p in prefixes
        ] + [
            {"name": f"{bucket}/{o['Key']}", "type": "file", "size": int(o["Size"])}
            for o in objects
            if o["Key"] != prefix
        ]
        if not entries and key:
            entries = [self.info(path)]  # a file lists as itself; nothing there raises
        return entries if detail else [entry["name"] for entry in entries]

    def info(self, path: str, **kwargs: Any) -> dict:
        from botocore.exceptions import ClientError

        bucket, key = self.split_path(path)
        if not key:
            self.client.head_bucket(Bucket=bucket)
            return {"name": bucket, "type": "directory", "size": 0}
        try:
            head = self.client.head_object(Bucket=bucket, Key=key)
            return {"name": f"{bucket}/{key}", "type": "file", "size": int(head["ContentLength"])}
        except ClientError as error:
            if not _is_missing(error):
                raise
        listed = self.client.list_objects_v2(Bucket=bucket, Prefix=f"{key}/", MaxKeys=1)
        if listed.get("KeyCount", 0):
            return {"name": f"{bucket}/{key}", "type": "directory", "size": 0}
        raise FileNotFoundError(f"s3://{bucket}/{key}")

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Nothing to make: a prefix exists once an object under it does."""

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """As :meth:`makedirs`."""

    def rm_file(self, path: str) -> None:
        bucket, key = self.split_path(path)
        self.client.delete_object(Bucket=bucket, Key=key)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Delete an object, or with ``recursive`` every object under a prefix as well;
        FileNotFoundError when there was nothing to delete (as fsspec's local files)."""
        for one in path if isinstance(path, list) else [path]:
            bucket, key = self.split_path(one)
            keys = [key] if self.isfile(one) else []
            if recursive:
                objects, _ = self._objects(bucket, f"{key}/")
                keys += [o["Key"] for o in objects]
            if not keys:
                raise FileNotFoundError(f"s3://{bucket}/{key}")
            for start in range(0, len(keys), _DELETE_BATCH):
                batch = [{"Key": k} for k in keys[start : start + _DELETE_BATCH]]
                self.client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
        self.invalidate_cache()

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        source_bucket, source_key = self.split_path(path1)
        bucket, key = self.split_path(path2)
        # The managed copy: one request up to 5 GB, parts above (S3's limit for one CopyObject).
        self.client.copy({"Bucket": source_bucket, "Key": source_key}, bucket, key)

    def mv(self, path1: str, path2: str, recursive: bool = False, **kwargs: Any) -> None:
        """Copy then delete; a prefix moves object by object."""
        if self.isfile(path1):
            self.cp_file(path1, path2)
            self.rm_file(path1)
            return
        bucket, key = self.split_path(path1)
        target_bucket, target_key = self.split_path(path2)
        objects, _ = self._objects(bucket, f"{key}/")
        if not objects:
            raise FileNotFoundError(f"s3://{bucket}/{key}")
        for entry in objects:
            rest = entry["Key"][len(key) :]
            self.cp_file(f"{bucket}/{entry['Key']}", f"{target_bucket}/{target_key}{rest}")
        self.rm(path1, recursive=True)

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict | None = None,
        **kwargs: Any,
    ) -> S3File:
        return S3File(
            self,
            path,
            mode,
            block_size=block_size or PART_BYTES,
            autocommit=autocommit,
            cache_options=cache_options,
            **kwargs,
        )


class S3File(AbstractBufferedFile):
    """One object: reads are ranged GETs; a write is one PUT, or a multipart upload of
    :data:`PART_BYTES` parts when it outgrows one (the object appears, whole, at close).
    Opened with ``pacer=`` (a :class:`Pacer`), its upload goes at the pacer's rate."""

    fs: S3FileSystem

    def _initiate_upload(self) -> None:
        self._upload_id: str | None = None
        self._parts: list[dict] = []

    def _upload_chunk(self, final: bool = False) -> bool:
        bucket, key = self.fs.split_path(self.path)
        # The buffer itself is the body (read from its start): a layer's hundreds of MB are
        # not copied once more.
        size = self.buffer.seek(0, 2)
        self.buffer.seek(0)
        client = self.fs.client
        pacer = self.kwargs.get("pacer")
        body = self.buffer if pacer is None else PacedReader(self.buffer, pacer)
        if final and self._upload_id is None:
            client.put_object(Bucket=bucket, Key=key, Body=body)
            return True
        if self._upload_id is None:
            started = client.create_multipart_upload(Bucket=bucket, Key=key)
            self._upload_id = started["UploadId"]
        if size:
            number = len(self._parts) + 1
            uploaded = client.upload_part(
                Bucket=bucket,
                Key=key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=body,
            )
            self._parts.append({"ETag": uploaded["ETag"], "PartNumber": number})
        if final:
            client.complete_multipart_upload(
                Bucket=bucket,
                Key=key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},
            )
        return True

    def discard(self) -> None:
        if getattr(self, "_upload_id", None):
            bucket, key = self.fs.split_path(self.path)
            self.fs.client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=self._upload_id)
            self._upload_id = None

    def _fetch_range(self, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        bucket, key = self.fs.split_path(self.path)
        response = self.fs.client.get_object(
            Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}"
        )
        return bytes(response["Body"].read())


class Pacer:
    """Lets bytes through at most at ``rate_bytes_per_s``: a write spread over seconds instead
    of taking a link whole (a checkpoint beside a pipeline's activations, on one instance's
    link). No credit builds up while nothing is sent (a pause is not made up by a burst). Not
    thread-safe: one writer."""

    def __init__(
        self,
        rate_bytes_per_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not rate_bytes_per_s > 0:
            raise ValueError(f"Pacer: rate_bytes_per_s must be > 0, not {rate_bytes_per_s}")
        self.rate_bytes_per_s = rate_bytes_per_s
        self._clock = clock
        self._sleep = sleep
        self._next_s: float | None = None
        self._hurried = False
        self.admitted_bytes = 0
        """Bytes let through so far."""
        self.slept_s = 0.0
        """Seconds it held bytes back so far (a write's time less this: what it took unpaced)."""

    def hurry(self) -> None:
        """Let every byte through at once from now on (someone waits for the write: a
        checkpoint asked for before instances go). Any thread may call it."""
        self._hurried = True

    def admit(self, num_bytes: int) -> None:
        """Wait until ``num_bytes`` more may go: until the bytes before them would have gone
        at the rate."""
        self.admitted_bytes += num_bytes
        if self._hurried:
            return
        now_s = self._clock()
        if self._next_s is not None and self._next_s > now_s:
            self._sleep(self._next_s - now_s)
            self.slept_s += self._next_s - now_s
            now_s = self._next_s
        self._next_s = now_s + num_bytes / self.rate_bytes_per_s


class PacedReader(io.RawIOBase):
    """A seekable byte stream read through a :class:`Pacer`, :data:`PACED_CHUNK_BYTES` at a
    time (an HTTP client sends a body as it reads it, in such chunks)."""

    def __init__(self, raw: io.BufferedIOBase | io.BytesIO, pacer: Pacer) -> None:
        super().__init__()
        self._raw = raw
        self._pacer = pacer

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes (all that is left: -1), let through a chunk at a time."""
        chunks = []
        left = -1 if size is None or size < 0 else size
        while left != 0:
            data = self._raw.read(PACED_CHUNK_BYTES if left < 0 else min(left, PACED_CHUNK_BYTES))
            if not data:
                break
            self._pacer.admit(len(data))
            chunks.append(data)
            left = left if left < 0 else left - len(data)
        return b"".join(chunks)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


PACED_CHUNK_BYTES = 128 * 2**10
"""Most bytes a paced read returns: 5 ms of a 200-Mbit/s link."""
