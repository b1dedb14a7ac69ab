"""Bad input stops the job with one line saying what and where: a model that fits no
configuration, a layer that raises in forward or backward, a loss that is not finite, a dataset
shorter than a batch. No instance hangs, and a step that went wrong is never committed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import bad_jobs
import pytest
import torch

from liveput.errors import LiveputError
from liveput.models.jobs import resolve_job
from liveput.models.training import TrainingConfig
from liveput.perf.configuration import Configuration
from liveput.runtime import protocol
from liveput.runtime.coordinator import Coordinator, CoordinatorConfig
from liveput.runtime.engine import EngineConfig
from liveput.runtime.inprocess import ThreadCluster
from liveput.runtime.planning import profile_job
from liveput.runtime.store import MemoryStore
from liveput.testbed.reference import parameter_mismatches, reference_parameters

STEPS = 8


def _cluster(tmp_path: Path, job_name: str) -> ThreadCluster:
    job = resolve_job(f"bad_jobs:{job_name}")
    return ThreadCluster(
        job,
        profile_job(job, repeats=1),
        str(tmp_path / "ckpt"),
        STEPS,
        EngineConfig(checkpoint_every=0, comm_timeout_s=20),
    )


@pytest.mark.process
@pytest.mark.parametrize(
    ("job_name", "where"),
    [
        ("forward_bomb_job", "layer 0 raised in forward at step 5: ValueError: cannot handle"),
        ("backward_bomb_job", "layer 0 raised in backward at step 5: FloatingPointError: gradient"),
        ("nan_loss_job", "the loss is nan at step 5; the step was not committed"),
    ],
)
@pytest.mark.parametrize("target", [Configuration(1, 2), Configuration(2, 1)])
def test_a_step_that_goes_wrong_stops_every_instance_with_one_line(
    tmp_path, job_name, where, target
):
    cluster = _cluster(tmp_path, job_name)
    with pytest.raises(protocol.JobFailure) as raised:
        cluster.migrate(target, set(), [0, 1], STEPS)
    assert str(raised.value) == protocol.job_error(cluster.store).args[0]
    assert where in str(raised.value) and "\n" not in str(raised.value)
    # Both instances stopped on it (the one that saw it, and its peer released from the step's
    # communication or commit wait): neither waited for a communication timeout and failed.
    assert set(cluster.failures) == {0, 1}
    assert {str(f) for f in cluster.failures.values()} == {str(raised.value)}
    # The steps before were applied, the bad one by nobody.
    assert {e.last_applied for e in cluster.engines.values()} == {bad_jobs.BAD_STEP - 1}
    plan = protocol.current_plan(cluster.store)
    assert (
        protocol.step_outcome(cluster.store, plan.generation, bad_jobs.BAD_STEP)
        != protocol.COMMITTED
    )


def test_a_model_that_fits_no_configuration_names_the_memory_it_needs():
    job = resolve_job("bad_jobs:forward_bomb_job")
    profile = profile_job(job, repeats=1)
    small = dataclasses.replace(
        profile, instance_type=dataclasses.replace(profile.instance_type, gpu_memory_gb=1e-7)
    )
    config = CoordinatorConfig(num_steps=10, num_micro_batches=job.num_micro_batches, capacity=3)
    with pytest.raises(
        LiveputError,
        match=r"forward-bomb fits no configuration of up to 3 "
        r"instances of \S+ \(1e-07 GB each\): it needs at least [\d.e-]+ GB per "
        r"instance \(D=\d, P=\d\)",
    ):
        Coordinator(MemoryStore(), small, config)
    Coordinator(MemoryStore(), profile, config)  # the real instance fits it


def test_a_dataset_shorter_than_a_batch_is_refused_in_one_line(capsys):
    with pytest.raises(
        LiveputError,
        match=r"^Job short-dataset: the dataset has 5 samples, "
        r"fewer than one batch \(8\)$",
    ):
        bad_jobs.short_dataset_job()
    from liveput.cli.main import main

    assert main(["train", "--model", "bad_jobs:short_dataset_job", "--steps", "2"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "error: Job short-dataset: the dataset has 5 samples, fewer than one batch (8)"
    )


def test_the_coordinator_stops_with_the_jobs_one_line():
    job = resolve_job("bad_jobs:forward_bomb_job")
    store = MemoryStore()
    coordinator = Coordinator(
        store,
        profile_job(job, repeats=1),
        CoordinatorConfig(num_steps=10, num_micro_batches=job.num_micro_batches, capacity=2),
    )
    assert coordinator.tick()
    protocol.fail_job(store, protocol.JobFailure("layer 0 raised in forward at step 5: boom"))
    protocol.fail_job(store, protocol.JobFailure("a later failure is not the news"))
    with pytest.raises(LiveputError, match=r"^layer 0 raised in forward at step 5: boom$"):
        coordinator.tick()


@pytest.mark.process
@pytest.mark.parametrize("target", [Configuration(1, 2), Configuration(2, 1)])
def test_a_nonfinite_loss_configured_to_skip_skips_that_update_on_every_stage(tmp_path, target):
    cluster = _cluster(tmp_path, "nan_once_skipped_job")
    cluster.migrate(target, set(), [0, 1], STEPS)
    plan = protocol.current_plan(cluster.store)
    assert (
        protocol.step_outcome(cluster.store, plan.generation, bad_jobs.BAD_STEP)
        == protocol.COMMITTED
    )
    assert {e.last_applied for e in cluster.engines.values()} == {STEPS - 1}
    got = {
        index: layer.module.state_dict()
        for engine in cluster.engines.values()
        for index, layer in engine.layers.items()
    }
    job = resolve_job("bad_jobs:nan_once_skipped_job")
    want = reference_parameters(job, STEPS)  # the single process skips step 5 too
    assert parameter_mismatches([got[i] for i in range(job.num_layers)], want) == []
    assert all(torch.isfinite(v).all() for layer in want for v in layer.values())
    # Skipped, not trained on: the same job with a clean step 5 ends elsewhere.
    clean = bad_jobs._job(
        lambda: torch.nn.Linear(4, 4), bad_jobs._Indexed(bad_jobs.SAMPLES), "clean"
    )
    assert parameter_mismatches(reference_parameters(clean, STEPS), want) != []


def test_skip_and_stop_are_the_only_answers_to_a_nonfinite_loss():
    with pytest.raises(LiveputError, match="on_nonfinite_loss must be one of stop, skip"):
        TrainingConfig(on_nonfinite_loss="ignore")
    assert TrainingConfig(on_nonfinite_loss="skip").global_norm_needed
