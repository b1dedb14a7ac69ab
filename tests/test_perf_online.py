"""The performance model learns: activation checkpointing in the estimator, and the online fit
from measured step times."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liveput.errors import LiveputError
from liveput.perf.builtin import builtin_profile
from liveput.perf.estimator import Calibration, calibration_for, estimate_configs
from liveput.perf.online import (
    fit_online,
    free_constants,
    measured_features,
    prediction_mape,
    refit,
)
from liveput.perf.types import InstanceType, LayerProfile, Measurement, ModelProfile

INSTANCE = InstanceType("test", 16.0, 10.0, 1.0, 3.0)


def random_profile(rng: np.random.Generator, layers: int, checkpointing: str) -> ModelProfile:
    """A layer keeps at least its input for the backward (as autograd's linear layers do)."""
    outputs = rng.integers(1e5, 1e7, layers)
    inputs = np.concatenate(([0], outputs[:-1]))
    saved = inputs + rng.integers(1e5, 1e8, layers)
    return ModelProfile(
        "random",
        INSTANCE,
        tuple(
            LayerProfile(f"block.{i}", float(f), float(2 * f), 1e-4, int(p), int(a), int(m))
            for i, (f, p, a, m) in enumerate(
                zip(
                    rng.uniform(1e-3, 1e-2, layers),
                    rng.integers(1e5, 1e7, layers),
                    outputs,
                    saved,
                    strict=True,
                )
            )
        ),
        global_batch_size=32,
        micro_batch_size=2,
        activation_checkpointing=checkpointing,
    )


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), layers=st.integers(1, 7), nodes=st.integers(1, 8))
def test_stage_memory_and_time_against_a_direct_count(seed, layers, nodes):
    """Every (D, P): each checkpointing mode's memory is the per-stage sum the estimator's
    docstring gives, counted layer by layer here; per-layer checkpointing never trains faster.
    (Its memory is not always lower: with one micro-batch in flight it holds every layer's input
    besides the layer it recomputes.)"""
    rng = np.random.default_rng(seed)
    tables = {
        mode: estimate_configs(
            random_profile(np.random.default_rng(seed), layers, mode), nodes, Calibration()
        )
        for mode in ("none", "layer", "stage")
    }
    profile = random_profile(rng, layers, "none")
    from liveput.perf.partition import partition_layers

    for k, (d, p) in enumerate(
        zip(tables["none"].data_parallel, tables["none"].pipeline_stages, strict=True)
    ):
        m = 32 / (d * 2)
        for mode, table in tables.items():
            bounds = partition_layers(
                dataclasses.replace(profile, activation_checkpointing=mode), int(p)
            )
            worst = 0.0
            for s in range(int(p)):
                stage = profile.layers[bounds[s] : bounds[s + 1]]
                inputs = [
                    0 if i == 0 else profile.layers[i - 1].activation_bytes
                    for i in range(bounds[s], bounds[s + 1])
                ]
                n = min(p - s, np.ceil(m))
                state = sum(layer.num_params for layer in stage) * 16
                saved = [layer.activation_memory_bytes for layer in stage]
                memory = {
                    "none": state + n * sum(saved),
                    "layer": state + max(saved) + n * sum(inputs),
                    "stage": state + sum(saved) + n * inputs[0],
                }[mode]
                worst = max(worst, memory)
            assert table.memory_gb[k] == pytest.approx(worst / 1e9, rel=1e-9)
        assert tables["layer"].samples_per_s[k] <= tables["none"].samples_per_s[k] * (1 + 1e-12)


def test_checkpointing_on_a_job_profile_memory_down_time_up():
    """The job's option reaches the estimator through its profile: per-layer checkpointing
    takes tiny-gpt-small's memory down by most of its activations and its step gets the forward
    once more."""
    from liveput.models.jobs import resolve_job
    from liveput.models.training import TrainingConfig
    from liveput.runtime.planning import profile_job

    job = resolve_job("tiny-gpt-small")
    checkpointed = profile_job(
        dataclasses.replace(job, training=TrainingConfig(activation_checkpointing=True)), repeats=1
    )
    assert checkpointed.activation_checkpointing == "layer"
    plain = dataclasses.replace(checkpointed, activation_checkpointing="none")
    for nodes, (d, p) in ((1, (1, 1)), (4, (1, 4))):
        rows = [estimate_configs(q, nodes, Calibration()) for q in (plain, checkpointed)]
        k = next(
            i
            for i, c in enumerate(zip(rows[0].data_parallel, rows[0].pipeline_stages))
            if c == (d, p)
        )
        assert rows[1].memory_gb[k] < rows[0].memory_gb[k]
    fast, slow = (
        float(estimate_configs(q, 1, Calibration()).samples_per_s[0]) for q in (plain, checkpointed)
    )
    forward = sum(layer.forward_s for layer in plain.layers)
    backward = sum(layer.backward_s for layer in plain.layers)
    optimizer = sum(layer.optimizer_s for layer in plain.layers)
    slots = plain.global_batch_size / plain.micro_batch_size
    assert fast / slow == pytest.approx(
        (slots * (2 * forward + backward) + optimizer) / (slots * (forward + backward) + optimizer),
        rel=1e-6,
    )
    with pytest.raises(LiveputError, match="activation_checkpointing must be one of"):
        dataclasses.replace(plain, activation_checkpointing="yes")


def synthetic(profile: ModelProfile, truth: Calibration, configs) -> list[Measurement]:
    theta = np.array(
        [
            truth.compute_scale,
            truth.transfer_scale,
            truth.slot_overhead_s,
            truth.allreduce_scale,
            truth.iteration_overhead_s,
        ]
    )
    probes = [Measurement(d, p, 1.0) for d, p in configs]
    seconds = measured_features(profile, probes) @ theta
    return [Measurement(d, p, float(t), 10) for (d, p), t in zip(configs, seconds, strict=True)]


def test_online_fit_recovers_known_constants_from_synthetic_measurements():
    """VGG-19's cuts send different activations at each depth, so all five constants are
    identifiable; GPT's boundary activation is the same at every cut (gamma's column is c's
    times a constant), so gamma stays at its prior there and the prediction is still exact."""
    truth = Calibration(
        compute_scale=1.7,
        transfer_scale=2.5,
        slot_overhead_s=0.03,
        allreduce_scale=1.4,
        iteration_overhead_s=0.8,
    )
    configs = [(d, p) for d in (1, 2, 3, 4) for p in (2, 3, 5, 8) if d * p <= 32]
    vgg = builtin_profile("vgg19")
    fitted = fit_online(vgg, synthetic(vgg, truth, configs))
    for name, value in dataclasses.asdict(truth).items():
        assert getattr(fitted, name) == pytest.approx(value, rel=1e-3), name
    assert prediction_mape(vgg, synthetic(vgg, truth, [(2, 6), (1, 12)]), fitted) < 1e-4
    gpt = builtin_profile("gpt-1.5b")
    configs = [(d, p) for d in (1, 2, 3, 4) for p in (4, 6, 8, 12) if d * p <= 32]
    measured = synthetic(gpt, truth, configs)
    assert free_constants(measured_features(gpt, measured)) == [0, 2, 3, 4]
    fitted = fit_online(gpt, measured)
    assert fitted.transfer_scale == 1.0
    assert fitted.compute_scale == pytest.approx(1.7, rel=1e-3)
    assert prediction_mape(gpt, synthetic(gpt, truth, [(2, 16), (1, 24)]), fitted) < 1e-4


def test_online_fit_with_few_configurations_fits_fewer_constants():
    profile = builtin_profile("gpt-1.5b")
    truth = Calibration(compute_scale=1.5, iteration_overhead_s=2.0)
    three = synthetic(profile, truth, [(1, 4), (1, 8), (1, 12)])
    # Only D = 1 ran: beta has nothing to fit; three rows fit two constants (alpha, d).
    assert free_constants(measured_features(profile, three)) == [0, 4]
    fitted = fit_online(profile, three)
    assert fitted.compute_scale == pytest.approx(1.5, rel=1e-3)
    assert fitted.iteration_overhead_s == pytest.approx(2.0, rel=1e-2)
    assert fitted.allreduce_scale == 1.0  # the prior, untouched
    unseen = synthetic(profile, truth, [(2, 8), (4, 6), (3, 10)])
    assert prediction_mape(profile, unseen, fitted) < 0.01
    assert prediction_mape(profile, unseen, Calibration()) > 0.2
    assert fit_online(profile, []) == Calibration()
    # One configuration measured twice counts once, as the step-weighted mean.
    base = synthetic(profile, truth, [(1, 4), (1, 12)])
    twice = [
        base[0],
        Measurement(1, 12, 1.0 * base[1].iteration_s, 1),
        Measurement(1, 12, 1.5 * base[1].iteration_s, 2),
    ]
    fitted = fit_online(profile, twice)
    assert free_constants(measured_features(profile, base)) == [0]
    assert prediction_mape(profile, [base[0]], fitted) > 0.01  # (1, 12) pulled alpha up
    pooled = [base[0], Measurement(1, 12, 4 / 3 * base[1].iteration_s, 3)]
    assert fitted == fit_online(profile, pooled)
    with pytest.raises(LiveputError, match="iteration time must be positive"):
        Measurement(1, 1, 0.0)


def prior_theta(calibration: Calibration) -> np.ndarray:
    return np.array(
        [
            calibration.compute_scale,
            calibration.transfer_scale,
            calibration.slot_overhead_s,
            calibration.allreduce_scale,
            calibration.iteration_overhead_s,
        ]
    )


def test_one_measured_configuration_leaves_every_prediction_at_the_prior():
    """A 1x1 measured three times slower than the prior says nothing about how 2x1 compares
    with it: fitting alpha to it alone would scale every prediction by the same guess."""
    profile = builtin_profile("gpt-1.5b")
    prior = calibration_for("gpt-1.5b")
    seconds = float(measured_features(profile, [Measurement(1, 4, 1.0)])[0] @ prior_theta(prior))
    fitted = fit_online(profile, [Measurement(1, 4, 3 * seconds, 50)], prior)
    assert fitted == prior
    assert refit(profile, [Measurement(1, 4, 3 * seconds, 50)]) == prior
    np.testing.assert_array_equal(
        estimate_configs(profile, 16, fitted).samples_per_s,
        estimate_configs(profile, 16, prior).samples_per_s,
    )


@pytest.mark.parametrize(
    ("factor", "pinned", "refitted"),
    [
        # Every step 5000x the prior's: alpha would leave (1') at its top; d explains it instead.
        (5000.0, "compute_scale", "iteration_overhead_s"),
        # The compute part alone, halved: d (0.17 s in the prior) would fall to 0.
        (0.5, "iteration_overhead_s", "compute_scale"),
    ],
)
def test_a_constant_the_fit_drives_to_its_bound_keeps_its_prior(factor, pinned, refitted):
    profile = builtin_profile("gpt-1.5b")
    prior = calibration_for("gpt-1.5b")
    assert prior.iteration_overhead_s > 0.1
    configs = [(1, 4), (2, 4), (1, 8)]
    features = measured_features(profile, [Measurement(d, p, 1.0) for d, p in configs])
    theta = prior_theta(prior)
    if factor < 1:
        theta[4] = 0.0
    seconds = factor * (features @ theta)
    measured = [Measurement(d, p, float(t), 10) for (d, p), t in zip(configs, seconds, strict=True)]
    assert free_constants(features) == [0, 4]
    fitted = fit_online(profile, measured, prior)
    assert getattr(fitted, pinned) == getattr(prior, pinned)
    assert getattr(fitted, refitted) != getattr(prior, refitted)
    low, high = 1e-3, 1e3
    assert low * 1.01 < fitted.compute_scale < high / 1.01
    assert fitted.iteration_overhead_s > 1e-6
    assert prediction_mape(profile, measured, fitted) < prediction_mape(profile, measured, prior)


@pytest.mark.process
def test_the_runtime_measures_what_it_runs_and_the_coordinator_refits(tmp_path):
    """Engines publish the step times of each configuration they run; the coordinator's next
    interval re-fits the estimator to them and plans with the new table."""
    from liveput.models.jobs import resolve_job
    from liveput.perf.configuration import Configuration
    from liveput.runtime import keys
    from liveput.runtime.coordinator import Coordinator, CoordinatorConfig
    from liveput.runtime.engine import EngineConfig
    from liveput.runtime.inprocess import ThreadCluster
    from liveput.runtime.planning import profile_job
    from liveput.runtime.step_times import read_measurements
    from liveput.runtime.store import MemoryStore

    job = resolve_job("tiny-gpt-small")
    profile = profile_job(job, repeats=1)
    cluster = ThreadCluster(
        job,
        profile,
        str(tmp_path / "ckpt"),
        24,
        EngineConfig(checkpoint_every=0, comm_timeout_s=20),
    )
    cluster.migrate(Configuration(1, 2), set(), [0, 1], run_until=8)
    cluster.migrate(Configuration(2, 1), set(), [], run_until=16)
    cluster.migrate(Configuration(1, 1), {1}, [], run_until=24)
    measured = read_measurements(cluster.store)
    assert [(m.data_parallel, m.pipeline_stages) for m in measured] == [(1, 1), (1, 2), (2, 1)]
    assert all(m.steps >= 5 and 0 < m.iteration_s < 10 for m in measured)
    # What the coordinator makes of them: the times of a machine known to compute 1.6x slower
    # than the profile says, published as the engines publish theirs. (Times measured in threads
    # on a busy machine may sit at the fit's bounds, which keep the prior: no fit to test.)
    slower = prior_theta(Calibration(compute_scale=1.6))
    times_s = measured_features(profile, measured) @ slower
    known = [dataclasses.replace(m, iteration_s=float(t)) for m, t in zip(measured, times_s)]
    store = MemoryStore()
    for generation, m in enumerate(known):
        record = {
            "data_parallel": m.data_parallel,
            "pipeline_stages": m.pipeline_stages,
            "step_s": m.iteration_s,
            "steps": m.steps,
        }
        store.set(keys.step_times(generation), json.dumps(record).encode())
    coordinator = Coordinator(
        store,
        profile,
        CoordinatorConfig(num_steps=10, num_micro_batches=job.num_micro_batches, capacity=4),
    )
    before = coordinator.table.samples_per_s.copy()
    coordinator.observe()  # the first observation is an interval's
    # Read back as a step-weighted mean (t * steps / steps), a time may move by one ulp.
    assert [(m.data_parallel, m.pipeline_stages, m.steps) for m in coordinator.measurements] == [
        (m.data_parallel, m.pipeline_stages, m.steps) for m in known
    ]
    assert [m.iteration_s for m in coordinator.measurements] == pytest.approx(
        [m.iteration_s for m in known], rel=1e-12
    )
    measured = list(coordinator.measurements)
    assert coordinator.calibration == fit_online(profile, measured)
    assert coordinator.calibration.compute_scale == pytest.approx(1.6, rel=0.05)
    assert not np.allclose(coordinator.table.samples_per_s, before)
    assert prediction_mape(profile, measured, coordinator.calibration) < prediction_mape(
        profile, measured, Calibration()
    )
    assert coordinator.policy.context.table is coordinator.table
