"""Profile JSON: what `liveput profile` writes and `load_profile(path)` reads."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from liveput.errors import LiveputError
from liveput.files import read_text_file, write_text_atomic
from liveput.perf.types import InstanceType, LayerProfile, ModelProfile


def profile_to_dict(profile: ModelProfile) -> dict:
    document = asdict(profile)
    # A measured profile is cut by ``compute``: its document stays as it was before profiles
    # named their partition method.
    if document["partition_method"] == "compute":
        del document["partition_method"]
    return document


def write_profile(profile: ModelProfile, path: str | Path) -> None:
    write_text_atomic(path, json.dumps(profile_to_dict(profile), indent=2) + "\n")


def profile_from_dict(document: dict) -> ModelProfile:
    """The inverse of :func:`profile_to_dict` (LiveputError if it is not one)."""
    try:
        return ModelProfile(
            model=document["model"],
            instance_type=InstanceType(**document["instance_type"]),
            layers=tuple(LayerProfile(**layer) for layer in document["layers"]),
            global_batch_size=int(document["global_batch_size"]),
            micro_batch_size=int(document["micro_batch_size"]),
            state_bytes_per_param=int(document.get("state_bytes_per_param", 16)),
            min_pipeline_stages=int(document.get("min_pipeline_stages", 1)),
            activation_checkpointing=str(document.get("activation_checkpointing", "stage")),
            partition_method=str(document.get("partition_method", "compute")),
        )
    except LiveputError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise LiveputError(f"not a liveput profile ({type(error).__name__}: {error})") from None


def read_profile(path: str | Path) -> ModelProfile:
    text = read_text_file(path, "profile")
    try:
        return profile_from_dict(json.loads(text))
    except json.JSONDecodeError as error:
        raise LiveputError(f"{path}: not a liveput profile (JSONDecodeError: {error})") from None
    except LiveputError as error:
        raise LiveputError(f"{path}: {error}") from None
