"""Engine: the same result whatever (D, P) and whatever migrations, exactly once."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_cluster import reference_parameters

from liveput.models.jobs import resolve_job
from liveput.models.training import LRSchedule, TrainingConfig
from liveput.perf.configuration import Configuration
from liveput.runtime.engine import Ending, EngineConfig
from liveput.runtime.inprocess import ThreadCluster
from liveput.runtime.ledger import verify_ledger
from liveput.runtime.planning import profile_job
from liveput.testbed.reference import reference_layers

JOB = "tiny-gpt-small"


def make_cluster(
    tmp_path, end_step: int, checkpoint_every: int, training: TrainingConfig | None = None
) -> ThreadCluster:
    job = resolve_job(JOB)
    if training is not None:
        job = dataclasses.replace(job, training=training)
    return ThreadCluster(
        job,
        profile_job(job, repeats=1),
        str(tmp_path / "ckpt"),
        end_step,
        EngineConfig(checkpoint_every=checkpoint_every, comm_timeout_s=20),
    )


def migrate(
    cluster: ThreadCluster,
    target: Configuration,
    preempted: set[int],
    allocated: list[int],
    run_until: int,
) -> None:
    results = cluster.migrate(target, preempted, allocated, run_until)
    plan = cluster.plan
    assert set(results) == set(plan.world)
    working = [r for i, r in results.items() if plan.slots[i] is not None]
    expected = Ending.FINISHED if run_until >= cluster.end_step else Ending.FENCED
    assert {r.ending for r in working} == {expected}
    assert {r.last_applied for r in working} == {min(run_until, cluster.end_step) - 1}


def final_parameters(cluster: ThreadCluster) -> list[dict[str, torch.Tensor]]:
    return [
        cluster.checkpointer.load_layer_file(f"final/layer-{i}.pt")["module"]
        for i in range(cluster.job.num_layers)
    ]


HALF_TOLERANCE = {"rtol": 1e-3, "atol": 1e-4}
"""bf16/fp16 against the reference: a weight one fp32 rounding apart (replicas' gradients summed
in another order) may cast to another 16-bit value in a forward, and SGD momentum carries it on.
Measured over this 12-step script: at most 6e-6 (fp16) and 4e-9 (bf16) on weights of about 0.1,
where clipping or a skipped fp16 step changes them by 0.1-0.35."""


def assert_same(parameters, reference, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    for got, want in zip(parameters, reference, strict=True):
        for name in want:
            assert torch.allclose(got[name], want[name], rtol=rtol, atol=atol), name


SCHEDULE = LRSchedule("cosine", warmup_steps=3, total_steps=12, min_ratio=0.1)
TRAINING = {
    "fp32": None,
    # 0.3 clips every step of this job (its gradient norm is 1-4): a stage that clipped by its
    # own norm instead of the global one would move its weights by 0.1 or more.
    "bf16-clip-schedule-ckpt": TrainingConfig(
        precision="bf16", clip_grad_norm=0.3, lr_schedule=SCHEDULE, activation_checkpointing=True
    ),
    # 2^20 overflows fp16 for the first steps, and the scale grows again every 3 clean steps:
    # the scaler skips, halves and doubles all through the run, across every migration.
    "fp16-scaler-clip": TrainingConfig(
        precision="fp16",
        initial_loss_scale=2.0**20,
        loss_scale_growth_interval=3,
        clip_grad_norm=2.0,
    ),
}


@pytest.mark.process
@pytest.mark.parametrize("training", list(TRAINING), ids=list(TRAINING))
def test_every_migration_kind_gives_the_uninterrupted_result(tmp_path, training):
    """Whatever (D, P) and migrations, the same computation as one process: fp32; bf16 with
    clipping by global norm, a schedule and activation checkpointing; fp16 whose loss scaler's
    state moves with the layers through transfers and the checkpoint restore."""
    steps = 12
    cluster = make_cluster(
        tmp_path, end_step=steps, checkpoint_every=3, training=TRAINING[training]
    )
    migrate(cluster, Configuration(2, 2), set(), [0, 1, 2, 3], run_until=2)
    migrate(cluster, Configuration(1, 2), {3}, [], run_until=4)  # intra-stage
    migrate(cluster, Configuration(2, 2), set(), [4, 5], run_until=6)  # inter-stage
    migrate(cluster, Configuration(1, 4), set(), [], run_until=8)  # pipeline
    stage3 = cluster.plan.instance_at(0, 3)
    migrate(cluster, Configuration(1, 2), {stage3}, [], run_until=steps)  # checkpoint-restore
    assert cluster.kinds == [
        "start",
        "intra-stage",
        "inter-stage",
        "pipeline",
        "checkpoint-restore",
    ]
    assert cluster.plan.restore_step == 5  # checkpoints after steps 2 and 5; 6 and 7 are redone
    reference = reference_layers(cluster.job, steps)
    tolerance = {} if cluster.job.training.precision == "fp32" else HALF_TOLERANCE
    assert_same(
        final_parameters(cluster), [layer.module.state_dict() for layer in reference], **tolerance
    )
    final = cluster.checkpointer.load_layer_file("final/layer-0.pt")
    assert final["training"] == reference[0].training
    if training == "fp16-scaler-clip":
        assert final["training"]["loss_scale"] < 2.0**20  # it moved
    if cluster.job.training.lr_schedule is not None:
        group = final["optimizer"]["param_groups"][0]
        assert group["lr"] == pytest.approx(group["initial_lr"] * SCHEDULE.factor(steps - 1))
    report = verify_ledger(cluster.store, cluster.job.global_batch_size, steps)
    assert report.exactly_once
    assert report.steps_rolled_back == 2
    assert report.restores == 1


def test_a_forged_layer_transfer_is_refused():
    from liveput.runtime.layer_state import decode_state, encode_state

    data = encode_state({"module": {"w": torch.ones(2)}, "optimizer": {}}, b"token")
    assert torch.equal(decode_state(data, b"token")["module"]["w"], torch.ones(2))
    with pytest.raises(ValueError, match="not signed"):
        decode_state(data, b"other")
    with pytest.raises(ValueError, match="not signed"):
        decode_state(data[32:], b"token")


@settings(max_examples=60, deadline=None)
@given(num_micro=st.integers(1, 12), stages=st.integers(1, 8))
def test_1f1b_completes_with_blocking_receives_and_bounds_activations(num_micro, stages):
    """Every stage's order, run with receives that block until the peer's slot is done
    (forward k on stage s needs forward k on s - 1; backward k needs backward k on s + 1),
    finishes (no deadlock), runs each micro-batch's backward after its forward, and keeps at
    most P - s micro-batches in flight on stage s."""
    from liveput.runtime.schedule import BACKWARD, FORWARD, stage_order

    orders = [stage_order(num_micro, stages, s) for s in range(stages)]
    done = [set() for _ in range(stages)]
    cursor = [0] * stages
    while any(cursor[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            if cursor[s] == len(orders[s]):
                continue
            kind, k = orders[s][cursor[s]]
            ready = (kind == FORWARD and (s == 0 or (FORWARD, k) in done[s - 1])) or (
                kind == BACKWARD
                and (FORWARD, k) in done[s]
                and (s == stages - 1 or (BACKWARD, k) in done[s + 1])
            )
            if ready:
                done[s].add((kind, k))
                cursor[s] += 1
                progressed = True
        assert progressed, "deadlock"
    for s, order in enumerate(orders):
        assert sorted(order) == sorted(
            [(FORWARD, k) for k in range(num_micro)] + [(BACKWARD, k) for k in range(num_micro)]
        )
        live = peak = 0
        for kind, _ in order:
            live += 1 if kind == FORWARD else -1
            peak = max(peak, live)
        assert peak == min(stages - s, num_micro)  # GPipe would keep all num_micro


@pytest.mark.process
def test_a_corrupt_checkpoint_is_refused_and_the_one_before_restores_the_same_result(tmp_path):
    steps = 12
    cluster = make_cluster(tmp_path, end_step=steps, checkpoint_every=3)
    migrate(cluster, Configuration(2, 2), set(), [0, 1, 2, 3], run_until=8)
    cluster.checkpointer.flush()  # checkpoints after steps 2 and 5
    layer_file = tmp_path / "ckpt" / "step-5" / "layer-1.pt"
    layer_file.write_bytes(layer_file.read_bytes()[:-100])  # truncated (a full disk, a crash)
    stage1 = cluster.plan.instance_at(0, 1)
    failed = cluster.migrate(
        Configuration(1, 2), {stage1, cluster.plan.instance_at(1, 1)}, [], run_until=steps
    )
    assert cluster.plan.restore_step == 5
    assert {r.ending for r in failed.values()} == {Ending.FAILED}
    migrate(cluster, Configuration(1, 2), set(), [], run_until=steps)
    assert cluster.plan.restore_step == 2  # the previous complete checkpoint
    assert_same(final_parameters(cluster), reference_parameters(steps, JOB))
    report = verify_ledger(cluster.store, cluster.job.global_batch_size, steps)
    assert report.exactly_once, report.problems


def test_a_layer_file_is_refused_unless_its_signature_matches(tmp_path):
    from liveput.runtime.checkpoint import Checkpointer, CorruptCheckpoint
    from liveput.runtime.layer_state import fresh_layer
    from liveput.runtime.store import MemoryStore

    job = resolve_job(JOB)
    store = MemoryStore()
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    writer = Checkpointer(store, str(tmp_path), token=b"job token")
    for step in (2, 5):
        writer.save_async(0, step, layers, job.num_layers)
        writer.flush()
    assert writer.load_layer(5, 0)["module"].keys() == layers[0].module.state_dict().keys()
    path = tmp_path / "step-5" / "layer-0.pt"
    good = path.read_bytes()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x01
    for bad in (good[:-1], bytes(flipped), good[40:], b""):
        path.write_bytes(bad)
        with pytest.raises(CorruptCheckpoint, match="layer-0.pt"):
            writer.load_layer(5, 0)
    path.write_bytes(good)
    with pytest.raises(CorruptCheckpoint, match="signature does not match"):
        Checkpointer(store, str(tmp_path), token=b"another job").load_layer(5, 0)
    assert writer.discard(5) == 2
    assert store.get("ckpt/complete") == b"[2]"
    assert writer.discard(2) is None  # none left: the next restore starts from the initial weights
    writer.close()


@given(num_layers=st.integers(1, 12), data_parallel=st.integers(1, 5), stages=st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_a_checkpoint_writes_every_layer_once_spread_over_the_replicas(
    num_layers, data_parallel, stages
):
    from liveput.runtime.engine import checkpoint_share
    from liveput.runtime.layer_state import LayerState
    from liveput.runtime.schedule import StagePosition

    stages = min(stages, num_layers)
    bounds = [round(num_layers * p / stages) for p in range(stages + 1)]
    written: list[int] = []
    for stage in range(stages):
        held = [
            LayerState(i, torch.nn.Identity(), None)
            for i in range(bounds[stage], bounds[stage + 1])
        ]
        shares = [
            len(checkpoint_share(held, StagePosition(d, stage, data_parallel, stages, None, None)))
            for d in range(data_parallel)
        ]
        written += [
            layer.index
            for d in range(data_parallel)
            for layer in checkpoint_share(
                held, StagePosition(d, stage, data_parallel, stages, None, None)
            )
        ]
        # No replica writes more than its even share, rounded up: pipeline 0 is not the
        # one that every other waits for.
        assert max(shares) <= -(-len(held) // data_parallel)
    assert sorted(written) == list(range(num_layers))


class _RecordingGroups:
    """Process groups that hand over given bytes and record when each receive happened."""

    def __init__(self, payloads: dict[int, bytes], events: list[str]) -> None:
        self.payloads, self.events = payloads, events

    def recv_bytes(self, peer: int, tag: int) -> bytes:
        self.events.append(f"recv {tag}")
        return self.payloads[tag]

    def wait(self, work) -> None:  # nothing is sent from the receiving instance
        raise AssertionError("the receiver sends nothing")


def test_a_receiver_takes_every_layers_bytes_before_it_builds_any(monkeypatch):
    """A sender with a notice is done once its bytes crossed the link: the receiver's building
    of each layer (its first optimizer imports torch._dynamo, seconds of CPU) comes after."""
    from liveput.runtime import layer_moves
    from liveput.runtime.engine import Engine
    from liveput.runtime.layer_moves import TRANSFER_TAG
    from liveput.runtime.layer_state import encode_state, fresh_layer
    from liveput.runtime.protocol import RuntimePlan, Transfer
    from liveput.runtime.store.memory import MemoryStore

    job = resolve_job(JOB)
    events: list[str] = []
    built = layer_moves.fresh_layer

    def recording_fresh_layer(job, index, device, initialize=True):
        events.append(f"build {index}")
        return built(job, index, device, initialize)

    monkeypatch.setattr(layer_moves, "fresh_layer", recording_fresh_layer)
    payloads = {
        TRANSFER_TAG + tag: encode_state(
            fresh_layer(job, layer, torch.device("cpu")).state_dict(), b"token"
        )
        for tag, layer in enumerate((0, 1))
    }
    plan = RuntimePlan(
        generation=1,
        epoch=0,
        start_step=5,
        end_step=100,
        data_parallel=1,
        pipeline_stages=1,
        boundaries=[0, job.num_layers],
        slots={0: (0, 0), 1: None},
        hosts={0: "127.0.0.1", 1: "127.0.0.1"},
        transfers=[Transfer(0, 1, 0), Transfer(1, 1, 0)],
    )
    engine = Engine(job, 0, MemoryStore(), lambda plan, rank: None, None, token=b"token")
    engine.layers = {i: fresh_layer(job, i, torch.device("cpu")) for i in range(2, job.num_layers)}
    engine.last_applied = 4
    engine._transfer(plan, _RecordingGroups(payloads, events), range(job.num_layers))
    assert events == [f"recv {TRANSFER_TAG}", f"recv {TRANSFER_TAG + 1}", "build 0", "build 1"]
    assert sorted(engine.layers) == list(range(job.num_layers))
