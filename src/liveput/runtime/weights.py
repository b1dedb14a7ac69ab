"""The trained model's weights out of liveput's files, as the unsplit model's ``state_dict``.

liveput keeps a model as one file per layer, so that any instance can take any layer: the signed
checkpoints ``<dir>/step-<s>/layer-<l>.pt`` (:mod:`liveput.runtime.checkpoint`: ``LPCKPT01``, a
signature, then ``torch.save`` bytes of the layer's module and optimizer state) and the plain
``<dir>/final/layer-<l>.pt`` that pipeline 0 writes when the job ends. The unsplit model is
``torch.nn.Sequential(*job.layers)``, whose keys are ``<l>.<name>``; this module joins layer
files into those keys. A checkpoint's signatures are verified before anything of it is
unpickled, and it is unpickled with ``weights_only=True``.

A checkpoint is complete when every layer of its step is on disk: layer files ``0 .. L-1``
where L is the job's layer count, given or (without it) the most layers any checkpoint or
``final/`` of that directory holds.
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from liveput.errors import LiveputError
from liveput.objectstore import url_to_fs
from liveput.runtime.checkpoint import open_layer_file

_STEP = re.compile(r"step-(\d+)$")
_LAYER = re.compile(r"layer-(\d+)\.pt$")
FINAL = "final"
"""The folder of the final layer files, under a checkpoint directory."""
TOKEN_FILE = "token"
"""The job token's file in a launched job's state folder (beside ``checkpoints/``), or in a
checkpoint folder of ``liveput train`` (beside its ``step-<s>/``)."""


@dataclass(frozen=True)
class CheckpointWeights:
    """A checkpoint read back: the unsplit model's weights and where they came from."""

    state_dict: dict[str, torch.Tensor]
    """Keys as ``torch.nn.Sequential(*job.layers).state_dict()`` has them (``<l>.<name>``)."""
    step: int | None
    """Training step after which the checkpoint was taken (None: the final weights)."""
    num_layers: int
    """L, the layers joined."""
    source: str
    """The folder the layer files were read from."""


def join_layers(modules: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Layer ``l``'s module state under ``<l>.<name>``: the unsplit ``nn.Sequential``'s keys."""
    return {
        f"{index}.{name}": tensor
        for index, state in enumerate(modules)
        for name, tensor in state.items()
    }


def _layers_in(fs: Any, folder: str) -> set[int]:
    try:
        names = fs.ls(folder, detail=False)
    except FileNotFoundError:
        return set()
    found = (_LAYER.search(str(name)) for name in names)
    return {int(match.group(1)) for match in found if match}


def final_layers_present(checkpoint_dir: str, num_layers: int) -> bool:
    fs, root = url_to_fs(checkpoint_dir.rstrip("/"))
    return _layers_in(fs, f"{root}/{FINAL}") >= set(range(num_layers))


def read_final(
    checkpoint_dir: str, num_layers: int, wait_s: float = 20.0
) -> dict[str, torch.Tensor]:
    """The final weights a finished job's pipeline 0 wrote under ``<checkpoint_dir>/final/``;
    waits up to ``wait_s`` for the last agents to finish writing them."""
    deadline = time.monotonic() + wait_s
    while not final_layers_present(checkpoint_dir, num_layers):
        if time.monotonic() > deadline:
            raise LiveputError(
                f"export: {checkpoint_dir}/{FINAL}/ lacks layer files: the job did not finish"
            )
        time.sleep(0.2)
    fs, root = url_to_fs(checkpoint_dir.rstrip("/"))
    modules = []
    for index in range(num_layers):
        with fs.open(f"{root}/{FINAL}/layer-{index}.pt", "rb") as handle:
            data = handle.read()
        modules.append(_unpickle(data, f"{checkpoint_dir}/{FINAL}/layer-{index}.pt")["module"])
    return join_layers(modules)


def _unpickle(payload: bytes, where: str) -> dict:
    try:
        state = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except Exception as error:  # noqa: BLE001 - any unpickling failure is refused the same way
        raise LiveputError(f"{where}: cannot be loaded: {str(error).splitlines()[0]}") from None
    if not isinstance(state, dict) or not isinstance(state.get("module"), dict):
        raise LiveputError(f"{where}: not a liveput layer state (no module state)")
    return state


def _as_bytes(token: str | bytes | None) -> bytes | None:
    return token.encode() if isinstance(token, str) else token


def read_checkpoint(
    path_or_url: str, token: str | bytes | None = None, num_layers: int | None = None
) -> CheckpointWeights:
    """Read a complete checkpoint, verifying every layer file's signature first.

    ``path_or_url`` (a local path or an fsspec URL) is a checkpoint directory (its newest
    complete step is read), one ``step-<s>`` folder of it, its ``final`` folder (plain files, no
    signature), or a launched job's state folder (its ``checkpoints/``; the token from its
    ``token`` file unless given). ``token``: the job token the files were signed with (None:
    files written without one, checked by SHA-256 only). ``num_layers``: the job's L, which
    makes a checkpoint missing its last layers incomplete for certain. A missing, incomplete,
    corrupt or forged checkpoint is a one-line :class:`LiveputError`."""
    fs, root = url_to_fs(path_or_url.rstrip("/"))
    if not fs.isdir(root):
        raise LiveputError(f"checkpoint {path_or_url}: no such folder")
    if fs.isdir(f"{root}/checkpoints") and fs.isfile(f"{root}/{TOKEN_FILE}"):
        if token is None:
            with fs.open(f"{root}/{TOKEN_FILE}", "rb") as handle:
                token = handle.read().strip()
        root, path_or_url = f"{root}/checkpoints", f"{path_or_url.rstrip('/')}/checkpoints"
    name = root.rsplit("/", 1)[-1]
    parent = root.rsplit("/", 1)[0] if "/" in root else "."
    if token is None:  # a checkpoint folder that keeps its token (``liveput train``'s)
        for folder in (root, parent):
            if fs.isfile(f"{folder}/{TOKEN_FILE}"):
                with fs.open(f"{folder}/{TOKEN_FILE}", "rb") as handle:
                    token = handle.read().strip()
                break
    if num_layers is not None:
        most = _most_layers(fs, parent if _STEP.fullmatch(name) or name == FINAL else root)
        if most > num_layers:
            raise LiveputError(
                f"checkpoint {path_or_url}: holds {most} layers, the job {num_layers}: "
                "it is a checkpoint of another model"
            )
    if _STEP.fullmatch(name) or name == FINAL:
        expected = num_layers or _most_layers(fs, parent)
        return _read_folder(fs, root, path_or_url, name, _as_bytes(token), expected)
    expected = num_layers or _most_layers(fs, root)
    steps = sorted(
        (
            int(match.group(1))
            for match in (_STEP.search(str(p)) for p in _folders(fs, root))
            if match
        ),
        reverse=True,
    )
    for step in steps:
        if _layers_in(fs, f"{root}/step-{step}") >= set(range(expected)):
            folder = f"{path_or_url.rstrip('/')}/step-{step}"
            return _read_folder(
                fs, f"{root}/step-{step}", folder, f"step-{step}", _as_bytes(token), expected
            )
    raise LiveputError(
        f"checkpoint {path_or_url}: no complete checkpoint (no step-<s> folder holds all "
        f"{expected} layer files; the most: {_most_layers(fs, root)})"
    )


def _folders(fs: Any, root: str) -> list[str]:
    return [
        str(entry["name"]) for entry in fs.ls(root, detail=True) if entry["type"] == "directory"
    ]


def _most_layers(fs: Any, root: str) -> int:
    """The most layers one checkpoint (or ``final/``) under ``root`` holds: the job's L unless
    every one of them lost its last layers."""
    counts = [max(_layers_in(fs, folder), default=-1) + 1 for folder in _folders(fs, root)]
    return max(counts, default=0)


def _read_folder(
    fs: Any, root: str, where: str, name: str, token: bytes | None, num_layers: int
) -> CheckpointWeights:
    present = _layers_in(fs, root)
    missing = sorted(set(range(num_layers)) - present)
    if num_layers == 0 or missing:
        listed = ", ".join(str(i) for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise LiveputError(
            f"checkpoint {where}: incomplete, "
            + (f"layer files missing: {listed}" if missing else "no layer files")
        )
    modules = []
    for index in range(num_layers):
        path = f"{root}/layer-{index}.pt"
        with fs.open(path, "rb") as handle:
            data = handle.read()
        file = f"{where}/layer-{index}.pt"
        payload = data if name == FINAL else open_layer_file(data, token, f"checkpoint {file}")
        modules.append(_unpickle(payload, f"checkpoint {file}")["module"])
    step = None if name == FINAL else int(name.removeprefix("step-"))
    return CheckpointWeights(join_layers(modules), step, num_layers, where)


def load(
    path_or_url: str, token: str | bytes | None = None, num_layers: int | None = None
) -> dict[str, torch.Tensor]:
    """The unsplit model's ``state_dict`` from a liveput checkpoint (signatures verified):
    :func:`read_checkpoint`'s ``state_dict``; load it into ``nn.Sequential(*job.layers)``."""
    return read_checkpoint(path_or_url, token, num_layers).state_dict
