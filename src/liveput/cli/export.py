"""`liveput export CHECKPOINT -o FILE|DIR`: a liveput checkpoint in the forms other tools read.

The checkpoint's layer files are verified against the job token before anything is unpickled;
``-o x.pt`` writes the unsplit model's ``state_dict``, ``-o DIR`` the same in
``torch.distributed.checkpoint``'s layout; with ``--model`` naming a transformers job, a
``save_pretrained`` folder too (``x.hf/`` beside the file, ``DIR/hf/``).
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from liveput.cli.output import console, print_json
from liveput.cli.params import FLAG
from liveput.errors import LiveputError


def export(
    checkpoint: str = typer.Argument(
        ...,
        help="A checkpoint directory (its newest complete step), one step-<s> folder of it, "
        "its final folder, or a launched job's folder (its checkpoints and token); a local "
        "path or an fsspec URL.",
        show_default=False,
    ),
    output: Path = typer.Option(
        ...,
        "-o",
        "--output",
        help="x.pt (or .pth): the unsplit model's state_dict, for torch.load(weights_only=True); "
        "any other name: a new folder in torch.distributed.checkpoint's layout.",
        show_default=False,
    ),
    token: str = typer.Option(
        None,
        "--token",
        help="The job token the checkpoint is signed with (or LIVEPUT_TOKEN; a launched "
        "job's folder has its own).",
    ),
    model: str = typer.Option(
        None,
        "--model",
        help="The job (built-in or module:function): the weights are checked against its "
        "layers, and a transformers job also gets a save_pretrained folder.",
    ),
    as_json: bool = typer.Option(
        False, "--json", metavar=FLAG, help="Print one JSON object (what was written)."
    ),
) -> None:
    """Export a checkpoint (signatures verified) as a state_dict file or a DCP folder."""
    from liveput.runtime.model_files import check_model_output, write_model
    from liveput.runtime.weights import FINAL, TOKEN_FILE, read_checkpoint

    token_given = token or os.environ.get("LIVEPUT_TOKEN") or None
    here = Path(checkpoint)
    kept = (here / TOKEN_FILE).is_file() or (here.parent / TOKEN_FILE).is_file()
    if token_given is None and not kept and here.name != FINAL:
        raise LiveputError(
            f"export: {checkpoint} is signed with its job token: give --token or LIVEPUT_TOKEN "
            "(the one its run had), or the launched job's folder"
        )
    check_model_output(output)
    layers = None
    if model is not None:
        from liveput.models.jobs import resolve_job

        layers = resolve_job(model).layers
    read = read_checkpoint(checkpoint, token_given, None if layers is None else len(layers))
    try:
        written = write_model(read.state_dict, layers, output)
    except LiveputError as error:
        raise LiveputError(f"export: {error}") from None
    paths = [str(path) for path in written]
    summary = {
        "checkpoint": read.source,
        "step": read.step,
        "layers": read.num_layers,
        "tensors": len(read.state_dict),
        "format": "dcp" if output.suffix.lower() not in (".pt", ".pth") else "state_dict",
        "written": paths,
    }
    if as_json:
        print_json(summary)
        return
    step = "final weights" if read.step is None else f"step {read.step}"
    console.print(
        f"{read.source} ({step}, {read.num_layers} layers) -> {', '.join(paths)}",
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    app.command("export")(export)
