"""Which device an instance trains on, from what the user asked for.

A request is ``auto`` (CUDA where this machine has it, else the CPU), ``cpu``, ``cuda`` (the
first GPU) or ``cuda:K``. One agent uses one device: an instance with several GPUs trains on one
of them (liveput runs one agent per instance), which :func:`unused_gpus` lets the launchers say.

Agents that share a machine (``liveput train``: every instance is a process here) cannot each
have a GPU of their own, and NCCL refuses two ranks on one GPU: they then communicate over gloo,
staging every message through CPU memory (:class:`~liveput.runtime.comm.Groups`), and compute on
the GPU (``cuda:K``, K the instance id modulo the GPUs present).
"""

from __future__ import annotations

import re

from liveput.errors import LiveputError

DEVICE_REQUESTS = ("auto", "cpu", "cuda")
"""What ``--device`` takes (``cuda:K`` names one GPU)."""
_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_device_request(request: str, where: str) -> str:
    """``request`` when it is a device request, else a one-line error naming ``where`` (no
    torch needed: a CLI checks its option before anything starts)."""
    if not isinstance(request, str) or not _PATTERN.fullmatch(request):
        raise LiveputError(f"{where}: device {request!r}: expected auto, cpu, cuda or cuda:K")
    return request


def resolve_device(request: str, where: str, instance: int | None = None) -> str:
    """The torch device (``cpu`` or ``cuda:K``) that ``request`` means on this machine.

    ``auto``: the first GPU where CUDA is present, else the CPU. ``cuda`` without CUDA is a
    one-line error naming ``where``; ``cuda`` with several GPUs and an ``instance`` (agents
    sharing this machine) spreads them, instance ``i`` on GPU ``i mod count``."""
    import torch

    check_device_request(request, where)
    if request == "cpu":
        return "cpu"
    available = torch.cuda.is_available()
    if request == "auto" and not available:
        return "cpu"
    if not available:
        raise LiveputError(
            f"{where}: --device {request} requested but this machine has no "
            f"CUDA device (torch {torch.__version__} sees none)"
        )
    count = torch.cuda.device_count()
    if ":" in request:
        index = int(request.split(":")[1])
        if index >= count:
            raise LiveputError(f"{where}: --device {request}: this machine has {count} GPU(s)")
        return request
    return f"cuda:{0 if instance is None else instance % count}"


def describe_device(device: str) -> str:
    """``cpu`` or ``cuda:0 (NVIDIA H100 80GB HBM3)``: what status and summaries show."""
    if not device.startswith("cuda"):
        return device
    import torch

    try:
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    except (RuntimeError, AssertionError):  # no such GPU here: name the device alone
        return device


def unused_gpus(gpus: int, device_request: str) -> int:
    """GPUs of an instance with ``gpus`` of them that a job asking for ``device_request`` leaves
    idle: all of them on the CPU, all but one otherwise (one agent per instance)."""
    if gpus <= 0:
        return 0
    return gpus if device_request == "cpu" else gpus - 1


def idle_gpus_message(instance_type: str, gpus: int, gpu: str, device: str) -> str | None:
    """What to tell a user whose instances of ``instance_type`` (``gpus`` GPUs of model
    ``gpu``) train on ``device`` (``cpu``, ``cuda``, ``cuda:K``), when some of those GPUs are
    paid for and left idle; None when every GPU is used."""
    unused = unused_gpus(gpus, device)
    if not unused:
        return None
    model = f"{gpu} " if gpu else ""
    if device == "cpu":
        return (
            f"{instance_type} has {gpus} {model}GPU(s) but the job trains on the CPU: "
            "they are billed and stay idle (ask for --device cuda where the agents run "
            "on a GPU)"
        )
    return (
        f"{instance_type} has {gpus} {model}GPUs: liveput runs one agent per instance, "
        f"which trains on one of them; {unused} are billed and stay idle (an instance type "
        "with one GPU costs less for the same work)"
    )
