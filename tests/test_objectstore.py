"""``s3://`` checkpoints on boto3 (liveput.objectstore), against moto's in-process S3: the fsspec
contract the checkpoints, exports and DCP use, the checkpointer's round trip and pruning, and a
bucket that does not exist refused in one line."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
import torch
from moto import mock_aws

from liveput.errors import LiveputError
from liveput.files import check_writable_url
from liveput.models.jobs import resolve_job
from liveput.objectstore import (
    PACED_CHUNK_BYTES,
    Pacer,
    S3FileSystem,
    url_to_fs,
    writes_whole_objects,
)
from liveput.runtime.checkpoint import Checkpointer, latest_checkpoint
from liveput.runtime.layer_state import fresh_layer
from liveput.runtime.store import MemoryStore

BUCKET = "liveput-test"


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    S3FileSystem.clear_instance_cache()  # each test's client made inside its own mock
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield BUCKET
    S3FileSystem.clear_instance_cache()


def test_objects_behave_as_files_and_prefixes_as_folders(bucket: str) -> None:
    fs, root = url_to_fs(f"s3://{bucket}/run/")
    assert isinstance(fs, S3FileSystem) and root == f"{bucket}/run"
    big = bytes(range(256)) * (11 * 2**20 // 256 + 7)  # three parts of 5 MiB and a bit
    with fs.open(f"{root}/a/big.bin", "wb", block_size=5 * 2**20) as handle:
        handle.write(big[:1000])
        handle.write(big[1000:])
    with fs.open(f"{root}/a/small.bin", "wb") as handle:
        handle.write(b"small")
    with fs.open(f"{root}/a/big.bin", "rb") as handle:
        assert handle.read() == big
        handle.seek(5 * 2**20 - 3)
        assert handle.read(10) == big[5 * 2**20 - 3 : 5 * 2**20 + 7]
    assert fs.ls(root, detail=False) == [f"{root}/a"]
    assert sorted(fs.ls(f"{root}/a", detail=False)) == [f"{root}/a/big.bin", f"{root}/a/small.bin"]
    assert fs.isdir(f"{root}/a") and fs.isfile(f"{root}/a/small.bin")
    assert not fs.exists(f"{root}/b") and fs.info(f"{root}/a/big.bin")["size"] == len(big)
    fs.mv(f"{root}/a/small.bin", f"{root}/a/moved.bin")
    assert fs.cat_file(f"{root}/a/moved.bin") == b"small" and not fs.exists(f"{root}/a/small.bin")
    fs.mv(f"{root}/a", f"{root}/c")
    assert fs.ls(root, detail=False) == [f"{root}/c"]
    assert fs.cat_file(f"{root}/c/big.bin") == big
    fs.rm(f"{root}/c", recursive=True)
    assert not fs.exists(f"{root}/c") and not fs.exists(root)
    with pytest.raises(FileNotFoundError):
        fs.rm(f"{root}/c", recursive=True)
    with pytest.raises(FileNotFoundError):
        fs.open(f"{root}/none.bin", "rb")


def test_a_checkpoint_round_trips_through_a_bucket_and_old_ones_are_pruned(bucket: str) -> None:
    store = MemoryStore()
    job = resolve_job("tiny-gpt")
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    url = f"s3://{bucket}/job/checkpoints"
    check_writable_url(url, "checkpoint dir")
    checkpointer = Checkpointer(store, url, keep=2)
    for step in (9, 19, 29):
        checkpointer.save_async(0, step, layers, job.num_layers)
        checkpointer.flush()
    assert latest_checkpoint(store) == 29
    fs, root = url_to_fs(url)
    assert fs.ls(root, detail=False) == [f"{root}/step-19", f"{root}/step-29"]
    # Written in place (an object appears whole), not aside and copied: no partial objects.
    assert writes_whole_objects(fs) and not writes_whole_objects(url_to_fs("/tmp")[0])
    names = fs.ls(f"{root}/step-29", detail=False)
    assert names == [f"{root}/step-29/layer-{i}.pt" for i in range(job.num_layers)]
    for layer in layers:
        loaded = checkpointer.load_layer(29, layer.index)
        for name, value in layer.module.state_dict().items():
            assert torch.equal(loaded["module"][name], value)
    checkpointer.close()


def test_a_bucket_that_does_not_exist_is_refused_in_one_line(bucket: str) -> None:
    with pytest.raises(LiveputError) as refused:
        check_writable_url("s3://no-such-bucket/ckpt", "checkpoint dir")
    message = str(refused.value)
    assert message.startswith("checkpoint dir s3://no-such-bucket/ckpt cannot be written: ")
    assert "NoSuchBucket" in message and "\n" not in message


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_saves_and_loads_a_sharded_state_through_a_bucket(bucket: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    url_to_fs(f"s3://{bucket}")  # s3:// resolved by liveput's filesystem from here on
    state = {"weight": torch.randn(64, 32), "step": torch.tensor(7)}
    dcp.save(state, storage_writer=FsspecWriter(f"s3://{bucket}/dcp/step-7", sync_files=False))
    loaded = {"weight": torch.zeros(64, 32), "step": torch.tensor(0)}
    dcp.load(loaded, storage_reader=FsspecReader(f"s3://{bucket}/dcp/step-7"))
    assert torch.equal(loaded["weight"], state["weight"]) and int(loaded["step"]) == 7
    fs, _ = url_to_fs(f"s3://{bucket}")
    assert fs.isfile(f"{bucket}/dcp/step-7/.metadata")


def test_a_paced_upload_sends_every_byte_through_its_pacer_once(bucket: str) -> None:
    fs, root = url_to_fs(f"s3://{bucket}/run/")
    data = bytes(range(256)) * 4096  # 1 MiB
    slept_s: list[float] = []
    now = [0.0]

    def sleep(seconds: float) -> None:
        slept_s.append(seconds)
        now[0] += seconds

    pacer = Pacer(2**20 / 4, clock=lambda: now[0], sleep=sleep)  # 1 MiB in 4 s
    with fs.open(f"{root}/paced.bin", "wb", pacer=pacer) as handle:
        handle.write(data)
    assert fs.cat_file(f"{root}/paced.bin") == data
    # Read once, as it is sent: no pass over the body before (a checksum, a signature).
    assert pacer.admitted_bytes == len(data)
    assert sum(slept_s) == pytest.approx(4.0 - PACED_CHUNK_BYTES / pacer.rate_bytes_per_s)
