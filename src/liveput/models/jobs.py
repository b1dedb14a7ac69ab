"""The built-in jobs, registered by name in :data:`JOBS`: ``tiny-gpt`` (and its variants),
``gpt2-small``, ``llama-tiny`` and ``resnet50``; :func:`resolve_job` finds one by name, or a user's
job given as ``module:function``.

The language models train on a text file given with ``--data`` (plain text, Arrow or Parquet;
byte-level tokens) or, without one, on the standard library's sources (as ``tiny-gpt`` does);
their vocabulary is the tokenizer's. ``resnet50`` trains on seeded synthetic images
(:class:`~liveput.models.resnet.SyntheticImages`): nothing is downloaded. Dropout is off, so a
run is the same computation whatever configuration trains it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from liveput.errors import LiveputError
from liveput.models.extras import require
from liveput.models.reference import is_reference, load_reference
from liveput.registry import Registry

# torch (and the Job contract, on it) on use: `liveput models` lists the names registered here,
# and importing torch took 1.3 of its 2.1 CPU-s.
if TYPE_CHECKING:
    import torch
    from torch import nn

    from liveput.models.job import Job

LOG = logging.getLogger(__name__)
JOBS: Registry[Callable[..., Job]] = Registry("job")
"""Built-in jobs by name: factories called without arguments, or with ``data=PATH`` (the
user's ``--data``) where they take it."""


@dataclass(frozen=True)
class TinyGPTJobConfig:
    """Shape and training settings of the built-in tiny-gpt job."""

    num_blocks: int = 4
    """Transformer blocks."""
    d_model: int = 256
    """Width of the residual stream."""
    seq_len: int = 64
    """Context length in bytes."""
    global_batch_size: int = 16
    """Samples per step."""
    micro_batch_size: int = 4
    """Samples per micro-batch."""
    learning_rate: float = 1e-3
    """AdamW learning rate (SGD with momentum when ``sgd``)."""
    sgd: bool = False
    """Use SGD with momentum instead of AdamW (bit-stable across configurations; tests)."""
    corpus_bytes: int = 2_000_000
    """Bytes of the standard library's sources to read."""
    seed: int = 0
    """Initialization seed."""


def tiny_gpt_job(config: TinyGPTJobConfig | None = None) -> Job:
    """tiny-gpt on the standard library's sources."""
    import torch

    from liveput.models.corpus import ByteWindows, load_stdlib_corpus
    from liveput.models.job import Job
    from liveput.models.tiny_gpt import (
        TinyGPTConfig,
        build_tiny_gpt,
        language_model_loss,
        tiny_gpt_init,
    )

    config = config or TinyGPTJobConfig()
    model = TinyGPTConfig(
        seq_len=config.seq_len, d_model=config.d_model, num_blocks=config.num_blocks, num_heads=4
    )
    rate = config.learning_rate

    def optimizer(parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
        if config.sgd:
            return torch.optim.SGD(parameters, lr=rate, momentum=0.9)
        return torch.optim.AdamW(parameters, lr=rate, weight_decay=0.0)

    return Job(
        layers=build_tiny_gpt(model, seed=config.seed),
        dataset=ByteWindows(load_stdlib_corpus(config.corpus_bytes), config.seq_len),
        loss_fn=language_model_loss,
        optimizer=optimizer,
        global_batch_size=config.global_batch_size,
        micro_batch_size=config.micro_batch_size,
        name="tiny-gpt",
        init_layer=tiny_gpt_init(config.seed),
    )


JOBS.register("tiny-gpt")(lambda: tiny_gpt_job())
JOBS.register("tiny-gpt-32")(
    lambda: tiny_gpt_job(TinyGPTJobConfig(global_batch_size=32, micro_batch_size=8))
)  # the batch `load_profile("tiny-gpt")` measures
JOBS.register("tiny-gpt-small")(
    lambda: tiny_gpt_job(
        TinyGPTJobConfig(
            num_blocks=2,
            d_model=64,
            seq_len=32,
            global_batch_size=8,
            micro_batch_size=2,
            learning_rate=0.05,
            sgd=True,
            corpus_bytes=200_000,
        )
    )
)


def resolve_job(spec: str, data: str | None = None, folders: Sequence[str | Path] = ()) -> Job:
    """A built-in job by name or ``module:function`` returning a :class:`Job`; ``data``: the
    file a built-in job that takes one trains on; ``folders``: where else the user's module is
    looked for after the current folder (:mod:`liveput.models.reference`)."""
    from liveput.models.job import Job

    if data is not None:
        takers = [
            name for name in JOBS.names() if "data" in inspect.signature(JOBS.get(name)).parameters
        ]
        if spec not in takers:
            raise LiveputError(
                f"job {spec!r} takes no --data; the built-in jobs that do: {', '.join(takers)}"
            )
        return JOBS.get(spec)(data=data)
    if spec in JOBS:
        return JOBS.get(spec)()
    if not is_reference(spec):
        raise LiveputError(
            f"unknown job {spec!r}: give a built-in ({', '.join(sorted(JOBS.names()))}) "
            "or module:function returning a liveput.Job"
        )
    made: Job = load_reference(spec, (Job,), "job", folders)
    return made


def resolve_empty_job(spec: str, data: str | None = None) -> Job:
    """Job ``spec`` (as :func:`liveput.models.jobs.resolve_job`) with its parameters on the
    ``meta`` device where it gives ``init_layer``; built whole where it does not (a user's job
    without one, or whose build needs real parameters)."""
    from liveput.models.lazy import empty_job

    try:
        with empty_job():
            job = resolve_job(spec, data)
    except Exception as error:  # noqa: BLE001 - the whole build below says what is wrong
        LOG.debug("job %s cannot be built without its weights (%s): built whole", spec, error)
        job = None
    if job is not None and job.init_layer is not None:
        return job
    if job is not None:
        LOG.info("job %s gives no init_layer: every agent builds all of its layers", spec)
    return resolve_job(spec, data)


@dataclass(frozen=True)
class CausalLMJobConfig:
    """Training settings of a built-in language-model job."""

    seq_len: int = 128
    """Context length in tokens."""
    global_batch_size: int = 16
    """Samples per step."""
    micro_batch_size: int = 4
    """Samples per micro-batch."""
    learning_rate: float = 1e-3
    """AdamW learning rate (SGD with momentum when ``sgd``)."""
    sgd: bool = False
    """SGD with momentum instead of AdamW (bit-stable across configurations; tests)."""
    data: str | None = None
    """Text, Arrow or Parquet file to train on (None: the standard library's sources)."""
    tokenizer: str = "byte"
    """``byte`` or the path of a ``tokenizer.json`` (with ``data``)."""
    corpus_bytes: int = 2_000_000
    """Bytes of the standard library's sources read when ``data`` is None."""
    seed: int = 0
    """Initialization seed."""

    def __post_init__(self) -> None:
        if self.seq_len < 1 or self.learning_rate <= 0 or self.corpus_bytes < 1:
            raise LiveputError(
                "language-model job: seq_len, learning_rate and corpus_bytes must be positive"
            )
        if self.data is None and self.tokenizer != "byte":
            raise LiveputError("language-model job: a tokenizer needs a --data file")


def _text_dataset(config: CausalLMJobConfig) -> tuple[torch.utils.data.Dataset, int]:
    """The dataset and its vocabulary size."""
    from liveput.models.corpus import ByteWindows, load_stdlib_corpus
    from liveput.models.text import TextDataset

    if config.data is None:
        return ByteWindows(load_stdlib_corpus(config.corpus_bytes), config.seq_len), 256
    dataset = TextDataset(config.data, config.tokenizer, config.seq_len)
    return dataset, dataset.vocab_size


def _optimizer(
    rate: float, sgd: bool, weight_decay: float = 0.0
) -> Callable[[list[nn.Parameter]], torch.optim.Optimizer]:
    def make(parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
        import torch

        if sgd:
            return torch.optim.SGD(parameters, lr=rate, momentum=0.9, weight_decay=weight_decay)
        return torch.optim.AdamW(parameters, lr=rate, weight_decay=weight_decay)

    return make


def causal_lm_job(
    name: str, make_config: Callable[[int, int], Any], config: CausalLMJobConfig
) -> Job:
    """A ``transformers`` causal LM job: ``make_config(vocab_size, seq_len)`` gives its
    config once the dataset has said how many tokens it has."""
    from liveput.models.hf import hf_causal_lm
    from liveput.models.job import Job
    from liveput.models.tiny_gpt import language_model_loss

    dataset, vocab_size = _text_dataset(config)
    layers, init_layer = hf_causal_lm(make_config(vocab_size, config.seq_len), config.seed)
    return Job(
        layers=layers,
        init_layer=init_layer,
        dataset=dataset,
        loss_fn=language_model_loss,
        optimizer=_optimizer(config.learning_rate, config.sgd),
        global_batch_size=config.global_batch_size,
        micro_batch_size=config.micro_batch_size,
        name=name,
    )


def gpt2_config(
    layers: int = 12, width: int = 768, heads: int = 12, positions: int = 1024, tied: bool = False
) -> Callable[[int, int], Any]:
    """GPT-2's config maker (defaults: GPT-2 small's shape, untied head), dropout off;
    ``tied``: the head is the token embedding (GPT-2's own default)."""

    def make(vocab_size: int, seq_len: int) -> Any:
        transformers = require("transformers", "the GPT-2 jobs")
        if seq_len > positions:
            raise LiveputError(f"gpt2: seq_len {seq_len} exceeds its {positions} positions")
        return transformers.GPT2Config(
            vocab_size=vocab_size,
            n_positions=positions,
            n_embd=width,
            n_layer=layers,
            n_head=heads,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=None,
            eos_token_id=None,
            tie_word_embeddings=tied,
        )

    return make


def llama_config(
    layers: int = 4, width: int = 256, heads: int = 4, kv_heads: int = 2, intermediate: int = 688
) -> Callable[[int, int], Any]:
    """Llama's config maker (defaults: ``llama-tiny``, grouped-query attention)."""

    def make(vocab_size: int, seq_len: int) -> Any:
        transformers = require("transformers", "the Llama jobs")
        return transformers.LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=width,
            intermediate_size=intermediate,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=seq_len,
            attention_dropout=0.0,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
            tie_word_embeddings=False,
        )

    return make


@dataclass(frozen=True)
class ResNetJobConfig:
    """Shape and training settings of a ResNet-50 job on synthetic images."""

    width: int = 64
    """Channels of the stem (64: ResNet-50; every stage scales with it)."""
    image_size: int = 224
    """Side of the square images."""
    num_classes: int = 1000
    """Classes (ImageNet's 1000)."""
    num_samples: int = 50_000
    """Synthetic images in the dataset."""
    global_batch_size: int = 32
    """Samples per step."""
    micro_batch_size: int = 8
    """Samples per micro-batch."""
    learning_rate: float = 0.0125
    """SGD learning rate (0.1 per 256 images, the usual ImageNet recipe)."""
    weight_decay: float = 1e-4
    """SGD weight decay."""
    seed: int = 0
    """Initialization and data seed."""


def resnet50_job(config: ResNetJobConfig | None = None) -> Job:
    """ResNet-50 on seeded synthetic images."""
    from torch.nn import functional as F

    from liveput.models.job import Job
    from liveput.models.resnet import SyntheticImages, build_resnet50, resnet_init

    config = config or ResNetJobConfig()
    return Job(
        layers=build_resnet50(config.num_classes, config.width, config.seed),
        dataset=SyntheticImages(
            config.num_samples, config.image_size, config.num_classes, config.seed
        ),
        loss_fn=F.cross_entropy,
        optimizer=_optimizer(config.learning_rate, True, config.weight_decay),
        global_batch_size=config.global_batch_size,
        micro_batch_size=config.micro_batch_size,
        name="resnet50",
        init_layer=resnet_init(config.seed),
    )


@JOBS.register("gpt2-small")
def gpt2_small_job(data: str | None = None) -> Job:
    """GPT-2 small's shape (12 blocks, 768 wide, 12 heads; untied head), 256-token contexts,
    batch 8 in micro-batches of 2."""
    return causal_lm_job(
        "gpt2-small",
        gpt2_config(),
        CausalLMJobConfig(
            seq_len=256, global_batch_size=8, micro_batch_size=2, learning_rate=3e-4, data=data
        ),
    )


@JOBS.register("llama-tiny")
def llama_tiny_job(data: str | None = None) -> Job:
    """A Llama of about 3 M parameters (4 blocks, 256 wide, 4 heads, 2 key-value heads),
    128-token contexts, batch 16 in micro-batches of 4."""
    return causal_lm_job("llama-tiny", llama_config(), CausalLMJobConfig(data=data))


JOBS.register("resnet50")(lambda: resnet50_job())
