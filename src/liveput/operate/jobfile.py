"""The job file: one YAML document, validated into typed configs.

Every mapping of the file is one dataclass below; a key the dataclass has no field for, or a
value of the wrong type, is a one-line :class:`LiveputError` naming the file, the line and the
key's path (``job.yaml:7: provider.workerz: unknown key (known: ...)``). Lines come from
PyYAML's node marks (the file is composed, not just loaded), so every value knows where it was.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from liveput.errors import LiveputError

OBJECTIVES = ("throughput", "deadline")


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often the job checkpoints."""

    url: str | None = None
    """Directory or fsspec URL every instance reaches (default: ``<state_dir>/checkpoints``)."""
    every: int = 10
    """K: checkpoint every K steps (0: never)."""
    keep: int = 2
    """Newest complete checkpoints kept."""

    def __post_init__(self) -> None:
        if self.every < 0 or self.keep < 1:
            raise LiveputError("checkpoint: every must be >= 0 and keep >= 1")


@dataclass(frozen=True)
class StoreSpec:
    """The job's store: a local etcd the launcher runs (data under the state directory)."""

    port: int = 0
    """Client port of the local etcd (0: a free one, kept for a resume); its peer port is the
    next one."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65535:
            raise LiveputError(f"store: port {self.port} must be in 0..65534")


@dataclass(frozen=True)
class ProviderSpec:
    """Where the instances come from (the emulated provider: a spot trace replayed on this
    machine, one agent process per instance)."""

    name: str = "emulated"
    """Provider; only ``emulated`` can be launched from a job file."""
    workers: int = 6
    """Instances requested (the generated trace is for this many)."""
    trace: str | None = None
    """Spot trace file to replay (default: a generated 5-minute one for ``workers``)."""
    trace_seed: int = 20
    """Seed of the generated trace and of the victims."""
    time_scale: float = 2.0
    """Trace seconds per wall second."""
    instance_type: str = "p3.2xlarge"
    """Catalog instance type: its spot and on-demand prices price the job."""
    on_demand_max: int | None = None
    """Most on-demand instances at once (deadline objective; default: the trace's peak)."""

    def __post_init__(self) -> None:
        if self.name != "emulated":
            raise LiveputError(
                f"provider: name {self.name!r}: only 'emulated' can be launched "
                "from a job file (use liveput coordinator --provider aws)"
            )
        if self.workers < 1 or self.time_scale <= 0 or self.trace_seed < 0:
            raise LiveputError("provider: workers must be >= 1, time_scale > 0, trace_seed >= 0")
        if self.on_demand_max is not None and self.on_demand_max < 0:
            raise LiveputError("provider: on_demand_max must be >= 0")
        from liveput.catalog import load_catalog

        load_catalog("aws").get(self.instance_type)  # an unknown type: a one-line error


@dataclass(frozen=True)
class ObjectiveSpec:
    """What the job optimizes."""

    kind: str = "throughput"
    """``throughput`` (liveput on the spot instances the trace gives) or ``deadline`` (finish by
    ``deadline_hours`` at the least cost, renting on-demand as needed)."""
    policy: str = "liveput"
    """The policy deciding configurations (a deadline policy with ``kind: deadline``)."""
    deadline_hours: float | None = None
    """Trace hours by which every step must be done (``kind: deadline``)."""
    budget_usd: float | None = None
    """Stop the job (state ``failed``) once it has spent this many dollars."""

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise LiveputError(
                f"objective: kind {self.kind!r} is not one of {', '.join(OBJECTIVES)}"
            )
        if (self.kind == "deadline") != (self.deadline_hours is not None):
            raise LiveputError("objective: deadline_hours goes with kind: deadline, and only then")
        if self.deadline_hours is not None and not self.deadline_hours > 0:
            raise LiveputError("objective: deadline_hours must be > 0")
        if self.budget_usd is not None and not self.budget_usd > 0:
            raise LiveputError("objective: budget_usd must be > 0")


@dataclass(frozen=True)
class NoticeSpec:
    """Preemption notices."""

    lead_s: float = 120.0
    """Notice lead, trace seconds (AWS 120, GCP 30)."""
    margin_s: float | str = "auto"
    """A noticed instance trains until this many wall seconds before the end its notice
    announces, then the job moves off it; ``auto``: from the moves the job measures
    (``liveput train --notice-margin``)."""

    def __post_init__(self) -> None:
        if self.lead_s < 0:
            raise LiveputError("notices: lead_s must be >= 0")
        if isinstance(self.margin_s, str):
            if self.margin_s != "auto":
                raise LiveputError(
                    f"notices: margin_s must be a number of seconds >= 0 or auto, "
                    f"got {self.margin_s!r}"
                )
        elif not self.margin_s >= 0:
            raise LiveputError(f"notices: margin_s must be >= 0, got {self.margin_s:g}")

    @property
    def margin_seconds(self) -> float | None:
        """``margin_s`` as the runtime takes it (None: ``auto``)."""
        return None if isinstance(self.margin_s, str) else self.margin_s


@dataclass(frozen=True)
class DashboardSpec:
    """The live dashboard the launcher serves (also the Prometheus ``/metrics``)."""

    port: int | None = None
    """TCP port (None: no dashboard; 0: a free one)."""
    host: str = "127.0.0.1"
    """Address it listens on; anything but loopback requires the job token in the URL."""

    def __post_init__(self) -> None:
        if self.port is not None and not 0 <= self.port < 65536:
            raise LiveputError(f"dashboard: port {self.port} must be in 0..65535")


@dataclass(frozen=True)
class MetricsSpec:
    """Metrics written for other tools."""

    tensorboard: str | None = None
    """Directory the TensorBoard scalars go to (None: none)."""


@dataclass(frozen=True)
class JobFile:
    """A job as a file: what to train, on what, toward what."""

    model: str = "tiny-gpt"
    """Built-in job name or ``module:function`` returning a :class:`liveput.Job` (its data
    comes with it)."""
    name: str = ""
    """The job's name (default: the file's stem)."""
    steps: int | None = None
    """Steps to train (give this or ``target_samples``; default 300)."""
    target_samples: int | None = None
    """Samples to train; rounded up to whole steps of the job's global batch."""
    device: str = "auto"
    """What each instance trains on: ``auto`` (CUDA where the instance has it), ``cpu``,
    ``cuda`` or ``cuda:K``; one agent per instance, on one device."""
    instance_memory_gb: float | None = None
    """Memory budget per instance, GB, in place of the profiled device's (``liveput train
    --instance-memory-gb``): only configurations whose every stage fits it are planned, and an
    agent refuses a stage over it; None: the device's memory."""
    state_dir: str | None = None
    """Where the job keeps its store data, token and exported model (default:
    ``.liveput/<name>`` beside the job file)."""
    linger_s: float = 600.0
    """How long the store stays readable after the job ends (``liveput stop`` ends it)."""
    export: str | None = None
    """Where the finished job's model goes, one ``state_dict`` file (default
    ``<state_dir>/model.pt``)."""
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    """Checkpoints."""
    store: StoreSpec = field(default_factory=StoreSpec)
    """The store."""
    provider: ProviderSpec = field(default_factory=ProviderSpec)
    """The instances."""
    objective: ObjectiveSpec = field(default_factory=ObjectiveSpec)
    """The objective."""
    notices: NoticeSpec = field(default_factory=NoticeSpec)
    """Preemption notices."""
    dashboard: DashboardSpec = field(default_factory=DashboardSpec)
    """The dashboard."""
    metrics: MetricsSpec = field(default_factory=MetricsSpec)
    """TensorBoard."""
    path: str = ""
    """The file this came from (set by the loader, not a key)."""

    def __post_init__(self) -> None:
        if self.steps is not None and self.target_samples is not None:
            raise LiveputError("give steps or target_samples, not both")
        if self.steps is not None and self.steps < 1:
            raise LiveputError("steps must be >= 1")
        if self.target_samples is not None and self.target_samples < 1:
            raise LiveputError("target_samples must be >= 1")
        if self.linger_s < 0:
            raise LiveputError("linger_s must be >= 0")
        if self.instance_memory_gb is not None and not (
            math.isfinite(self.instance_memory_gb) and self.instance_memory_gb > 0
        ):
            raise LiveputError(
                f"instance_memory_gb must be a finite number of GB > 0, got "
                f"{self.instance_memory_gb:g}"
            )
        from liveput.runtime.device import check_device_request

        check_device_request(self.device, "device")

    def num_steps(self, global_batch_size: int) -> int:
        """Steps to train: ``steps``, or ``target_samples`` in whole global batches."""
        if self.target_samples is not None:
            return -(-self.target_samples // global_batch_size)
        return self.steps or 300

    @property
    def job_name(self) -> str:
        return self.name or Path(self.path).stem or "job"

    @property
    def state_path(self) -> Path:
        if self.state_dir is not None:
            return Path(self.state_dir)
        return Path(self.path).resolve().parent / ".liveput" / self.job_name


_NOT_KEYS = {"path"}


def load_job_file(path: str | Path) -> JobFile:
    """Read and check the job file at ``path``; one-line LiveputError naming file:line:key."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not a text file"
        raise LiveputError(f"{where}: cannot read the job file: {reason}") from None
    return parse_job_file(text, where)


def parse_job_file(text: str, where: str = "job.yaml") -> JobFile:
    """The job file in ``text`` (``where`` names it in errors)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise LiveputError(f"{where}{line}: malformed YAML: {problem}") from None
    if root is None:
        raise LiveputError(f"{where}: the job file is empty")
    job = _build(JobFile, root, where, "")
    return dataclasses.replace(job, path=where, model=_located_model(job.model, root, where))


def _located_model(model: str, root: yaml.Node, where: str) -> str:
    """The job file's ``model:``, a user's ``module:function`` rewritten to name the folder its
    module is found in (the current folder, else the job file's), so that the agents and a
    ``resume`` from another folder find it; one line naming the folders when it is nowhere."""
    from liveput.models.reference import is_reference, locate_reference

    if not is_reference(model):
        return model
    try:
        return locate_reference(model, [Path(where).resolve().parent])
    except LiveputError as error:
        line = next(
            (
                f":{_line(key)}"
                for key, _ in getattr(root, "value", ())
                if getattr(key, "value", None) == "model"
            ),
            "",
        )
        raise LiveputError(f"{where}{line}: model: {error}") from None


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _build(cls: type, node: yaml.Node, where: str, prefix: str) -> Any:
    if not isinstance(node, yaml.MappingNode):
        raise LiveputError(
            f"{where}:{_line(node)}: {prefix.rstrip('.') or 'the job file'}: "
            "expected a mapping of keys"
        )
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.name not in _NOT_KEYS]
    values: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        name = f"{prefix}{key}"
        if key not in known:
            raise LiveputError(
                f"{where}:{_line(key_node)}: {name}: unknown key (known: {', '.join(known)})"
            )
        if key in values:
            raise LiveputError(f"{where}:{_line(key_node)}: {name}: given twice")
        values[key] = _value(hints[key], value_node, where, name)
    try:
        return cls(**values)
    except LiveputError as error:
        raise LiveputError(f"{where}:{_line(node)}: {error}") from None


def _value(hint: Any, node: yaml.Node, where: str, name: str) -> Any:
    """``node`` as the type ``hint`` (a dataclass, str, int, float, bool, or one of them | None)."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if isinstance(options[0], type) and dataclasses.is_dataclass(options[0]):
        return _build(options[0], node, where, f"{name}.")
    wanted = [t for t in options if t is not type(None)]
    expected = " or ".join(t.__name__ for t in wanted) + (
        " or null" if len(wanted) < len(options) else ""
    )
    if not isinstance(node, yaml.ScalarNode):
        raise LiveputError(
            f"{where}:{_line(node)}: {name}: expected {expected}, got a "
            f"{'list' if isinstance(node, yaml.SequenceNode) else 'mapping'}"
        )
    value = _scalar(node)
    if value is None and type(None) in options:
        return None
    for kind in wanted:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return value
    raise LiveputError(f"{where}:{_line(node)}: {name}: expected {expected}, got {node.value!r}")


def _scalar(node: yaml.ScalarNode) -> Any:
    """The Python value of a scalar node, typed as YAML's core schema resolves it."""
    constructor = yaml.constructor.SafeConstructor()
    return constructor.construct_object(node, deep=True)
