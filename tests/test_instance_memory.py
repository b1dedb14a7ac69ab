"""A per-instance memory budget (``--instance-memory-gb``, the job file's ``instance_memory_gb``):
the planner takes it for the instances' memory, so a job that fits one instance runs only as a
deep enough pipeline; a budget no configuration fits is one line before training; and an agent
refuses a stage over it in one line instead of allocating it."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time

import numpy as np
import pytest
from measured import gpt2_small_profile

from liveput.cli.main import main
from liveput.cli.train import _from_job_file
from liveput.errors import LiveputError
from liveput.forecast.base import Forecast
from liveput.launch.assemble import JobRequest, assemble_job
from liveput.models.jobs import resolve_job
from liveput.operate.job_training import training_config
from liveput.operate.jobfile import load_job_file, parse_job_file
from liveput.perf import MigrationCostModel, load_profile
from liveput.perf.configuration import Configuration
from liveput.perf.estimator import estimate_configs, smallest_fit, stage_peak_bytes
from liveput.perf.partition import partition_layers
from liveput.perf.profile_io import profile_to_dict
from liveput.perf.types import ModelProfile, with_instance_memory
from liveput.plan import LiveputOptimizer, OptimizerConfig
from liveput.policies import Observation, PolicyContext, make_policy
from liveput.runtime import keys, protocol
from liveput.runtime.coordinator import CoordinatorConfig
from liveput.runtime.coordinator.policy import fit, history_trace
from liveput.runtime.engine import Engine, EngineConfig
from liveput.runtime.launch import DEFAULT_COMM_TIMEOUT_S, JobSpec, comm_timeout_s, run_coordinator
from liveput.runtime.planning import profile_job, require_a_fit
from liveput.runtime.stage_memory import StageBudget, stage_refusal
from liveput.runtime.store import MemoryStore
from liveput.traces import Trace
from liveput.traces.formats import write_trace


@pytest.fixture(scope="module")
def gpt2() -> ModelProfile:
    """gpt2-small's layers as the memory model sees them, timed alike (``measured``)."""
    return gpt2_small_profile()


def _single_instance_need_gb(profile: ModelProfile) -> float:
    table = estimate_configs(profile, 1)
    return float(table.memory_gb[0])


def _brute_force(profile: ModelProfile, budget_gb: float, instances: int) -> dict:
    """Every (D, P) on at most ``instances`` whose every stage, cut as the engine cuts it, fits
    ``budget_gb``, with its estimated rate: from the per-stage memory, not the table's."""
    table = estimate_configs(profile, instances)
    rates = dict(
        zip(
            zip(table.data_parallel.tolist(), table.pipeline_stages.tolist(), strict=True),
            table.samples_per_s.tolist(),
            strict=True,
        )
    )
    fitting = {}
    for d in range(1, instances + 1):
        for p in range(1, instances // d + 1):
            if d * profile.micro_batch_size > profile.global_batch_size:
                continue
            cuts = partition_layers(profile, p)
            peak = max(
                stage_peak_bytes(profile, range(cuts[s], cuts[s + 1]), s, p, d) for s in range(p)
            )
            if peak <= budget_gb * 1e9:
                fitting[(d, p)] = rates[(d, p)]
    return fitting


@pytest.mark.parametrize("recompute", ["none", "layer", "stage"])
def test_an_agents_stage_memory_is_the_tables_stage_by_stage(gpt2, recompute):
    for profile in (
        dataclasses.replace(gpt2, activation_checkpointing=recompute),
        load_profile("vgg19"),
    ):
        table = estimate_configs(profile, 12)
        for d, p, memory_gb in zip(
            table.data_parallel, table.pipeline_stages, table.memory_gb, strict=True
        ):
            cuts = partition_layers(profile, int(p))
            stages = [
                stage_peak_bytes(profile, range(cuts[s], cuts[s + 1]), s, int(p), int(d))
                for s in range(int(p))
            ]
            assert max(stages) / 1e9 == pytest.approx(memory_gb, rel=1e-12)


def test_a_third_of_gpt2_smalls_need_makes_every_configuration_a_deep_pipeline(gpt2):
    need_gb = _single_instance_need_gb(gpt2)
    # 86 M parameters x 16 bytes (fp32 weights, gradients, Adam's two moments), plus the
    # activations of the 4 micro-batches a single instance keeps in flight.
    assert gpt2.num_params == pytest.approx(86.2e6, rel=0.01)
    assert gpt2.num_params * 16 / 1e9 == pytest.approx(1.38, abs=0.01)
    assert need_gb == pytest.approx(1.91, abs=0.01)
    budget_gb = need_gb / 3
    budgeted = with_instance_memory(gpt2, budget_gb)
    table = estimate_configs(budgeted, 12)
    feasible = set(
        zip(
            table.data_parallel[table.feasible].tolist(),
            table.pipeline_stages[table.feasible].tolist(),
            strict=True,
        )
    )
    assert feasible == set(_brute_force(gpt2, budget_gb, 12))
    assert feasible and min(p for _, p in feasible) >= 3
    stages, memory_gb = smallest_fit(budgeted)
    assert stages == 6 and memory_gb == pytest.approx(0.595, abs=0.001)
    # Four instances hold no pipeline that fits: one line before training, naming P = 6.
    with pytest.raises(LiveputError) as refused:
        require_a_fit(estimate_configs(budgeted, 4), budgeted, 4)
    assert str(refused.value) == (
        f"gpt2-small fits no configuration of up to 4 instances of test-cpu ({budget_gb:g} GB "
        "each): it needs at least 0.885 GB per instance (D=1, P=4); the smallest that fits "
        f"{budget_gb:g} GB is P=6 at D=1 (0.595 GB per instance, 6 instances)"
    )


def _policy_decision(profile: ModelProfile, table, instances: int, name: str) -> Configuration:
    policy = make_policy(
        name,
        PolicyContext(profile=profile, table=table, costs=MigrationCostModel(), capacity=instances),
    )
    decision = policy.decide(
        Observation(
            time_s=0.0,
            interval_index=0,
            interval_s=60.0,
            history=history_trace((instances,), instances, 60.0),
            num_available=instances,
            current=None,
            capacity=instances,
        )
    )
    assert decision.configuration is not None
    return decision.configuration


@pytest.mark.parametrize("instances", [4, 5, 6])
def test_the_planners_decision_is_the_fastest_configuration_within_the_budget(gpt2, instances):
    """With 0.9 GB per instance (under half of gpt2-small's 1.91 GB on one), 4 to 6 instances
    run it only as pipelines of 3 stages or more; the coordinator's fastest fit, the liveput
    optimizer (over an interval so long that a start costs nothing) and the reactive policy
    choose the fastest configuration that brute force finds within the budget, and the liveput
    policy one within it."""
    budget_gb = 0.9
    budgeted = with_instance_memory(gpt2, budget_gb)
    table = estimate_configs(budgeted, instances)
    fitting = _brute_force(gpt2, budget_gb, instances)
    assert fitting and all(p >= 3 for _, p in fitting)
    best_rate = max(fitting.values())
    best = min((p, d) for (d, p), rate in fitting.items() if rate == best_rate)[::-1]
    config = CoordinatorConfig(
        num_steps=10, num_micro_batches=4, capacity=instances, instance_memory_gb=budget_gb
    )
    fastest = fit(None, instances, table, budgeted, config)
    assert fastest is not None
    assert (fastest.data_parallel, fastest.pipeline_stages) == best
    # A configuration the table has over the budget is never kept, even when asked for.
    assert fit(Configuration(1, 1), instances, table, budgeted, config) == fastest
    optimizer = LiveputOptimizer(
        budgeted, table, MigrationCostModel(), OptimizerConfig(horizon=2, interval_s=1e9)
    )
    decided = optimizer.decide(None, instances, Forecast.certain(np.array([instances]), instances))
    assert decided.configuration == Configuration(*best)
    assert _policy_decision(budgeted, table, instances, "reactive") == Configuration(*best)
    chosen = _policy_decision(budgeted, table, instances, "liveput")
    assert (chosen.data_parallel, chosen.pipeline_stages) in fitting


def test_the_coordinator_plans_with_the_budget_and_refuses_one_nothing_fits(gpt2):
    from liveput.runtime.coordinator import Coordinator

    config = CoordinatorConfig(num_steps=10, num_micro_batches=4, capacity=6)
    coordinator = Coordinator(
        MemoryStore(), gpt2, dataclasses.replace(config, instance_memory_gb=0.9)
    )
    assert coordinator.profile.instance_type.gpu_memory_gb == 0.9
    assert min(coordinator.table.pipeline_stages[coordinator.table.feasible]) >= 3
    with pytest.raises(LiveputError, match=r"the smallest that fits 0.3 GB is P=13 at D=1"):
        Coordinator(MemoryStore(), gpt2, dataclasses.replace(config, instance_memory_gb=0.3))
    with pytest.raises(LiveputError, match=r"no pipeline of its 14 layers fits 0.1 GB$"):
        Coordinator(MemoryStore(), gpt2, dataclasses.replace(config, instance_memory_gb=0.1))


def test_liveput_coordinators_refusal_is_at_once_not_retried_as_a_store_outage(gpt2):
    config = CoordinatorConfig(
        num_steps=10, num_micro_batches=4, capacity=6, instance_memory_gb=0.3
    )
    started = time.monotonic()
    with pytest.raises(LiveputError, match=r"the smallest that fits 0.3 GB is P=13 at D=1"):
        run_coordinator(MemoryStore(), JobSpec("gpt2-small", "ckpt"), config, profile=gpt2)
    assert time.monotonic() - started < 10.0  # not the store outage's 120 s


def test_the_assembly_carries_the_budget_to_the_planner_and_the_agents(gpt2):
    request = JobRequest("tiny-gpt-small", 10, "ckpt", instance_memory_gb=0.9)
    assembled = assemble_job(request, profile=gpt2)
    assert assembled.spec.instance_memory_gb == 0.9
    assert assembled.config.instance_memory_gb == 0.9
    assert assembled.profile is not None
    assert assembled.profile.instance_type.gpu_memory_gb == 0.9
    plain = assemble_job(dataclasses.replace(request, instance_memory_gb=None), profile=gpt2)
    assert plain.profile is not None and plain.profile.instance_type.gpu_memory_gb == 16.0
    assert plain.spec.instance_memory_gb is None and plain.config.instance_memory_gb is None


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_a_budget_that_is_no_size_is_refused_in_one_line(value):
    with pytest.raises(LiveputError, match=r"^job: --instance-memory-gb must be a finite number"):
        JobRequest("tiny-gpt", 1, "ckpt", instance_memory_gb=value)
    with pytest.raises(LiveputError, match=r"^coordinator: instance_memory_gb must be a finite"):
        CoordinatorConfig(num_steps=1, num_micro_batches=1, instance_memory_gb=value)
    text = "instance_memory_gb: .nan\n" if math.isnan(value) else f"instance_memory_gb: {value}\n"
    text = text.replace("inf", ".inf")
    with pytest.raises(
        LiveputError, match=r"^job.yaml:1: instance_memory_gb must be a finite number of GB > 0"
    ):
        parse_job_file(text)


def test_the_job_file_takes_the_budget(tmp_path):
    assert parse_job_file("instance_memory_gb: 2\n").instance_memory_gb == 2.0
    assert parse_job_file("model: tiny-gpt\n").instance_memory_gb is None
    path = tmp_path / "job.yaml"
    path.write_text("model: tiny-gpt-small\ninstance_memory_gb: 0.0025\n")
    assert _from_job_file(path)[0].instance_memory_gb == 0.0025  # liveput train --job
    job = load_job_file(path)
    launched = training_config(job, 10, store_url="tcp://127.0.0.1:1", token="token")
    assert launched.instance_memory_gb == 0.0025  # liveput launch


@pytest.mark.parametrize("value", ["0", "nan", "-1"])
@pytest.mark.parametrize("command", ["train", "coordinator"])
def test_the_option_refuses_a_budget_that_is_no_size_in_one_line(command, value, capsys):
    assert main([command, "--instance-memory-gb", value]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "Traceback" not in error
    assert error.startswith(f"error: {command}: --instance-memory-gb: must be")


def test_an_agent_refuses_a_stage_over_the_budget_in_one_line(gpt2):
    budget = StageBudget(with_instance_memory(gpt2, 0.9))
    # D = 1, P = 2: the first stage holds the embedding and 6 blocks (1.23 GB).
    plan = protocol.RuntimePlan(
        3, 0, 0, 10, 1, 2, [0, 7, 14], {5: (0, 0), 6: (0, 1), 7: None}, {}, [], "start"
    )
    assert stage_refusal(budget, plan, 5) == (
        "stage 0 of plan 3 (D=1, P=2: layers 0-6) needs 1.23 GB per instance, over the "
        "instance memory budget of 0.9 GB (--instance-memory-gb); instance 5 refused it"
    )
    assert stage_refusal(budget, plan, 7) is None  # a spare holds no stage
    deep = dataclasses.replace(plan, pipeline_stages=4, boundaries=[0, 4, 8, 11, 14])
    assert stage_refusal(budget, deep, 5) is None  # 0.885 GB


@pytest.fixture(scope="module")
def small_profile():
    return profile_job(resolve_job("tiny-gpt-small"), repeats=1)


def test_an_engine_refuses_its_stage_before_allocating_and_ends_the_job(small_profile):
    """tiny-gpt-small on one instance needs 2.8 MB; with 2 MB per instance the engine refuses
    the one-stage plan with one line, allocates no layer, and the job's error is that line."""
    store = MemoryStore()
    store.set(keys.job_profile(), json.dumps({"profile": profile_to_dict(small_profile)}).encode())
    job = resolve_job("tiny-gpt-small")
    engine = Engine(
        job,
        0,
        store,
        rendezvous=None,
        checkpointer=None,
        config=EngineConfig(instance_memory_gb=0.002),
    )
    plan = protocol.RuntimePlan(
        0, 0, 0, 5, 1, 1, [0, 4], {0: (0, 0)}, {0: "127.0.0.1"}, [], "start", protocol.FRESH_START
    )
    with pytest.raises(protocol.JobFailure) as refused:
        engine.run_generation(plan)
    line = str(refused.value)
    assert re.fullmatch(
        r"stage 0 of plan 0 \(D=1, P=1: layers 0-3\) needs 0\.002[6-9]\d* GB per instance, over "
        r"the instance memory budget of 0\.002 GB \(--instance-memory-gb\); instance 0 refused it",
        line,
    )
    assert engine.layers == {}
    assert protocol.job_error(store) is not None and str(protocol.job_error(store)) == line
    # Within 10 MB the same plan trains.
    roomy = MemoryStore()
    roomy.set(keys.job_profile(), store.get(keys.job_profile()))
    fine = Engine(job, 0, roomy, None, None, config=EngineConfig(instance_memory_gb=0.01))
    assert fine.run_generation(plan).last_applied == 4
    assert fine.stage_check.budget is not None and protocol.job_error(roomy) is None


@pytest.mark.process
def test_train_under_a_budget_runs_only_pipelines_that_fit_it(tmp_path, capsys):
    """tiny-gpt-small needs 2.8 MB on one instance, 1.6 MB per instance as 2 stages: with
    2.5 MB per instance every plan of the run is a pipeline of 2 stages or more, every agent
    checks its stage against the budget, and every step is applied exactly once."""
    trace = tmp_path / "two.csv"
    write_trace(Trace.from_counts("two", np.array([0.0]), np.array([2]), 3600.0), trace)
    out = tmp_path / "run.json"
    code = main(
        [
            "train",
            *("--model", "tiny-gpt-small", "--workers", "2", "--trace", str(trace)),
            *("--steps", "20", "--time-scale", "10", "--device", "cpu"),
            *("--instance-memory-gb", "0.0025", "-o", str(out), "--json"),
        ]
    )
    assert code == 0, capsys.readouterr().err
    summary = json.loads(out.read_text())
    assert summary["exactly_once"] is True and summary["steps_completed"] == 20
    assert summary["plans"] and all(
        int(plan["configuration"].split("x")[1]) >= 2 for plan in summary["plans"]
    )
    steps = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(20))
    assert all(s["pipeline_stages"] >= 2 for s in steps)


@pytest.mark.process
def test_train_with_a_budget_no_configuration_fits_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "train",
            *("--model", "tiny-gpt-small", "--workers", "2", "--steps", "2", "--device", "cpu"),
            *("--instance-memory-gb", "0.000001"),
        ]
    )
    assert code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and re.fullmatch(
        r"error: tiny-gpt fits no configuration of up to 2 instances of \S+ \(1e-06 GB each\): "
        r"it needs at least [\d.]+ GB per instance \(D=1, P=\d\); no pipeline of its 4 layers "
        r"fits 1e-06 GB; agents' logs in liveput-logs",
        lines[0],
    )
    assert not list((tmp_path / "liveput-logs").glob("i-*.log"))  # no agent was started


def test_the_planner_told_of_slow_links_keeps_replicas_off_them(gpt2):
    """At 10 Gb/s two pipelines of four beat one of eight; at 0.1 Gb/s each step's gradient
    all-reduce between the replicas costs more than the second pipeline gains, so the assembly
    carries the links' rate to the planner and its best configuration of 8 is one pipeline."""
    request = JobRequest("tiny-gpt-small", 10, "ckpt", instance_memory_gb=0.9)
    fast = assemble_job(request, profile=gpt2)
    slow = assemble_job(dataclasses.replace(request, network_gbps=0.1), profile=gpt2)
    assert fast.profile is not None and slow.profile is not None
    assert slow.profile.instance_type.network_gbps == 0.1
    assert slow.profile.instance_type.gpu_memory_gb == 0.9
    best_fast = estimate_configs(fast.profile, 8).best_for(8)
    best_slow = estimate_configs(slow.profile, 8).best_for(8)
    assert best_fast is not None and best_slow is not None
    assert best_fast[0] > 1 and best_slow[0] == 1, (best_fast, best_slow)
    # The policy weighs a move at the same rate: a 258-MB stage (21 s at 100 Mbit/s's line
    # rate; the measured point-to-point table's efficiency makes it 29) is no longer 0.3 s away.
    stage_bytes = 258e6
    assert fast.config.costs.transfer_s(stage_bytes) < 0.5
    assert 21 < slow.config.costs.transfer_s(stage_bytes) < 35
    # Checkpoints cross the same links: no faster than 12.5 MB/s there, 2.6 GB/s by default.
    assert slow.config.costs.checkpoint_bandwidth_bytes_per_s == 0.1e9 / 8
    assert fast.config.costs.checkpoint_bandwidth_bytes_per_s == 2.6e9
    for value in (0.0, -1.0, math.nan):
        with pytest.raises(LiveputError, match=r"^job: the network rate must be a finite"):
            dataclasses.replace(request, network_gbps=value)


def test_a_process_group_operation_waits_as_long_as_the_links_need_to_move_the_state():
    """A migration sends an instance's layers one after the other over its link: on slow links
    the agents' collective timeout grows past the time the model's state takes (twice it),
    never below the default."""
    request = JobRequest("gpt2-small", 10, "ckpt", instance_memory_gb=0.9)
    assembled = assemble_job(request)
    default = assembled.spec
    slow = assemble_job(dataclasses.replace(request, network_gbps=0.1)).spec
    assert default.comm_timeout_s == DEFAULT_COMM_TIMEOUT_S
    # gpt2-small's fp32 weights and Adam's two moments: 1.03 GB, 82.6 s at 0.1 Gb/s. Counted
    # on the job assembled above (gpt2-small, built once more, took a third of this test).
    assert assembled.job.name == "gpt2-small"
    weights = sum(p.numel() for layer in assembled.job.layers for p in layer.parameters())
    assert slow.comm_timeout_s == pytest.approx(2 * 8 * 3 * 4 * weights / 0.1e9)
    assert 160 < slow.comm_timeout_s < 170
    assert comm_timeout_s(3 * 4 * weights, 10.0) == DEFAULT_COMM_TIMEOUT_S
    # A spec published by an older coordinator, without the field, keeps the default.
    published = {k: v for k, v in dataclasses.asdict(slow).items() if k != "comm_timeout_s"}
    assert JobSpec(**published).comm_timeout_s == DEFAULT_COMM_TIMEOUT_S
    with pytest.raises(LiveputError, match=r"^job spec: comm_timeout_s must be > 0"):
        dataclasses.replace(slow, comm_timeout_s=0.0)
