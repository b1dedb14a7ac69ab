"""The unsplit model's weights written in the forms other tools read.

- ``FILE.pt``: a plain ``state_dict`` of ``torch.nn.Sequential(*job.layers)`` (``torch.save``,
  loadable with ``torch.load(FILE, weights_only=True)``);
- ``DIR``: the same state dict in ``torch.distributed.checkpoint``'s layout (read it with
  ``torch.distributed.checkpoint.load(state_dict, checkpoint_id=DIR)``);
- for a job cut from a ``transformers`` model, a ``save_pretrained`` folder beside either
  (``FILE.hf/`` beside ``FILE.pt``, ``DIR/hf/`` inside ``DIR``), loadable with
  ``AutoModelForCausalLM.from_pretrained``.

Every form is written aside and moved into place: a failed export leaves no half folder.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from liveput.errors import LiveputError
from liveput.files import check_output_file, check_output_folder, write_bytes_atomic
from liveput.models.hf import hf_config_of, to_hf_causal_lm

LOG = logging.getLogger(__name__)
STATE_DICT_SUFFIXES = (".pt", ".pth")
"""An output named so gets the plain state dict; any other name is a DCP folder."""
HF_SUFFIX = ".hf"
"""The ``save_pretrained`` folder beside a ``FILE.pt`` is ``FILE.hf``."""
HF_FOLDER = "hf"
"""The ``save_pretrained`` folder inside a DCP folder."""


def is_dcp_output(output: Path) -> bool:
    """Whether ``output`` names a DCP folder (any name but ``*.pt`` or ``*.pth``)."""
    return output.suffix.lower() not in STATE_DICT_SUFFIXES


def check_model_output(output: Path, dcp: bool | None = None) -> None:
    """Refuse, in one line and before any work, an output that cannot be written: a state-dict
    file's missing or unwritable folder, or a DCP folder that holds files already. ``dcp``:
    which form (None: as the name says)."""
    if not (is_dcp_output(output) if dcp is None else dcp):
        check_output_file(output)
        return
    if output.exists() and output.is_dir() and any(output.iterdir()):
        raise LiveputError(f"{output}: folder is not empty; name a new folder for the export")
    check_output_folder(output)


def write_model(
    state: Mapping[str, torch.Tensor],
    layers: Sequence[nn.Module] | None,
    output: Path,
    dcp: bool | None = None,
) -> list[Path]:
    """Write ``state`` (the unsplit model's keys) to ``output`` as a state-dict file or a DCP
    folder (``dcp``; None: as its name says), plus the ``save_pretrained`` folder when
    ``layers`` are a transformers job's; the paths written. ``layers`` (None: unknown) are
    checked to take ``state`` first."""
    dcp = is_dcp_output(output) if dcp is None else dcp
    check_model_output(output, dcp)
    if layers is not None:
        _check_fits(state, layers)
    hf = layers is not None and hf_config_of(layers) is not None
    if not dcp:
        buffer = io.BytesIO()
        torch.save(dict(state), buffer)
        written = [write_bytes_atomic(output, buffer.getvalue())]
        if hf and layers is not None:
            written.append(
                _replace_folder(output.with_suffix(HF_SUFFIX), _pretrained(layers, state))
            )
        return written

    def fill(folder: Path) -> None:
        save_dcp(state, folder)
        if hf and layers is not None:
            _pretrained(layers, state)(folder / HF_FOLDER)

    written = [_replace_folder(output, fill)]
    if hf:
        written.append(output / HF_FOLDER)
    return written


def export_final(checkpoint_dir: str, layers: Sequence[nn.Module], output: Path) -> list[Path]:
    """The final weights a finished job wrote under ``<checkpoint_dir>/final/``, written to
    ``output`` (a state-dict file, plus the ``save_pretrained`` folder of a transformers job)."""
    from liveput.runtime.weights import read_final

    return write_model(read_final(checkpoint_dir, len(layers)), layers, output, dcp=False)


def save_dcp(state: Mapping[str, torch.Tensor], folder: Path) -> None:
    """``state`` in ``torch.distributed.checkpoint``'s layout under ``folder``, from this one
    process (no process group)."""
    from torch.distributed.checkpoint.state_dict_saver import save

    with warnings.catch_warnings():
        # Saving from one process without a process group is what is meant here.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        save({key: tensor.contiguous() for key, tensor in state.items()}, checkpoint_id=folder)


def _check_fits(state: Mapping[str, torch.Tensor], layers: Sequence[nn.Module]) -> None:
    expected = nn.Sequential(*layers).state_dict()
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or extra or wrong:
        first = (missing or extra or wrong)[0]
        what = "lacks" if missing else "has the unknown key" if extra else "has another shape for"
        raise LiveputError(f"the weights do not fit the job's layers: they {what} {first!r}")


def _pretrained(
    layers: Sequence[nn.Module], state: Mapping[str, torch.Tensor]
) -> Callable[[Path], None]:
    def save(folder: Path) -> None:
        to_hf_causal_lm(layers, state).save_pretrained(str(folder))

    return save


def _replace_folder(target: Path, fill: Callable[[Path], None]) -> Path:
    """Fill a new folder beside ``target`` with ``fill(folder)``, then move it to ``target``
    (replacing a folder of that name only once the new one is complete)."""
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        fill(staging)
        os.chmod(staging, 0o777 & ~_umask())
        if target.exists():
            old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old."))
            os.replace(target, old / target.name)
            os.replace(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    LOG.info("wrote %s", target)
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
