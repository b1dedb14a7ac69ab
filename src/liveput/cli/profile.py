"""`liveput profile`: measure a real PyTorch model layer by layer."""

from __future__ import annotations

from pathlib import Path

import typer

from liveput.cli import params
from liveput.cli.output import console, progress
from liveput.files import check_output_file


def register(app: typer.Typer) -> None:
    """Add the `profile` command to the root app."""

    @app.command("profile")
    def profile(
        model: str = typer.Option(
            "tiny-gpt",
            "--model",
            help="Built-in name (tiny-gpt or a built-in job) or module:function returning a "
            "liveput.Job (found in the current folder first), profiled on its own dataset.",
        ),
        micro_batch: int = typer.Option(
            None,
            "--micro-batch",
            parser=params.MICRO_BATCH,
            help="Samples per micro-batch (default: the job's, else 8).",
        ),
        device: str = typer.Option(
            "auto", "--device", help="cpu, cuda[:k], or auto: CUDA when present."
        ),
        precision: str = typer.Option(
            "fp32",
            "--precision",
            help="fp32, bf16 or fp16: forwards under autocast, as the job trains.",
        ),
        repeats: int = typer.Option(
            5, "--repeats", parser=params.REPEATS, help="Timed passes per layer."
        ),
        output: Path = typer.Option(..., "-o", "--output", help="Profile JSON to write."),
    ) -> None:
        """Measure forward, backward and optimizer time of every layer; write a profile."""
        # torch is imported here, not at start-up, so that every other command starts fast.
        from liveput.perf.profile_io import write_profile
        from liveput.perf.profiler import profile_model, resolve_target

        check_output_file(output)
        target = resolve_target(model)
        with progress() as bar:
            task = bar.add_task(f"profiling {target.name}", total=len(target.layers))
            measured = profile_model(
                target,
                micro_batch or target.micro_batch_size or 8,
                device,
                repeats,
                on_layer=lambda done, _: bar.update(task, completed=done),
                precision=precision,
            )
        write_profile(measured, output)
        console.print(
            f"wrote {output}: {measured.num_layers} layers, "
            f"{measured.num_params / 1e6:.2f} M parameters"
        )
