"""Published models as ``algorithms.models.Model`` presets, for the training schedules.

The presets carry the parameter counts of the published architectures, tensor by tensor in
the order torch registers them, so that gradient buckets are cut as they would be for the
real model, and their forward FLOPs per sample. Compute time is FLOPs / throughput, with
the backward pass at twice the forward (the usual 2N forward, 4N backward FLOPs per token of
Kaplan et al., "Scaling Laws for Neural Language Models", 2020, section 2.1).

Presets and their sources:

* ``resnet50``: He et al., "Deep Residual Learning for Image Recognition", 2015, Table 1
  (bottleneck blocks 3-4-6-3, torchvision's layout: stride on the 3x3 conv); 25,557,032
  parameters; 224x224 RGB input, 1000 classes.
* ``bert-base``: Devlin et al., "BERT", 2018 (L=12, H=768, A=12, vocab 30522, 512
  positions); 109,482,240 parameters with the pooler; sequences of 512 tokens.
* ``gpt2-small``: Radford et al., "Language Models are Unsupervised Multitask Learners",
  2019 (12 layers, d=768, vocab 50257, 1024 positions, output tied to the token embedding);
  124,439,808 parameters; sequences of 1024 tokens.
* ``llama-7b``: Touvron et al., "LLaMA", 2023, Table 2 (32 layers, d=4096, 32 heads, SwiGLU
  hidden 11008, vocab 32000, no biases, RMSNorm, untied output); 6,738,415,616 parameters;
  sequences of 2048 tokens.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence

from algorithms.models import Layer, Model

# Achieved training throughput per GPU when none is given: about 40% of an A100's
# 312 TFLOP/s dense bf16 peak (NVIDIA A100 datasheet), a common model-FLOPs utilisation.
DEFAULT_THROUGHPUT = 125e12  # FLOP/s
BACKWARD_FLOPS_RATIO = 2.0  # backward FLOPs / forward FLOPs (Kaplan et al. 2020)

# A layer of a preset: (layer name, parameter tensors, forward FLOPs per sample).
LayerSpec = tuple[str, tuple[int, ...], float]


def _conv(c_in: int, c_out: int, k: int, out_hw: int) -> tuple[tuple[int, ...], float]:
    # A bias-free conv and its batch norm (weight, bias): tensors, and 2 FLOPs per MAC.
    return (c_in * c_out * k * k, c_out, c_out), 2.0 * c_in * c_out * k * k * out_hw * out_hw


def _resnet50() -> tuple[list[LayerSpec], int, int]:
    specs: list[LayerSpec] = []
    params, flops = _conv(3, 64, 7, 112)
    specs.append(("conv1", params, flops))
    c_in, hw = 64, 56  # after the 3x3 max pool
    for stage, (blocks, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512)), 1):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 1 else 1
            out_hw = hw // stride
            parts = [_conv(c_in, width, 1, hw), _conv(width, width, 3, out_hw),
                     _conv(width, 4 * width, 1, out_hw)]
            if block == 0:  # the projection shortcut
                parts.append(_conv(c_in, 4 * width, 1, out_hw))
            specs.append((f"layer{stage}.{block}", sum((p for p, _ in parts), ()),
                          sum(f for _, f in parts)))
            c_in, hw = 4 * width, out_hw
    specs.append(("fc", (2048 * 1000, 1000), 2.0 * 2048 * 1000))
    return specs, 3 * 224 * 224 * 4, 1000 * 4


def _transformer_block(d: int, ffn: int, n_ctx: int, llama: bool) -> tuple[tuple[int, ...], float]:
    """One block's tensors (pre-norm order: norm, attention, norm, MLP) and forward FLOPs per
    sample: 2 per weight per token, plus 2 * 2 * n_ctx * d per token for the attention scores
    and values (Kaplan et al. 2020, Table 1, counts QK^T and AV as 2 n_ctx d_attn)."""
    if llama:  # RMSNorm, no biases, SwiGLU MLP (gate, up and down projections)
        norm, attention, mlp = (d,), (d * d,) * 4, (d * ffn,) * 3
    else:  # LayerNorm, biases, fused QKV projection, GELU MLP
        norm = (d, d)
        attention = (d * 3 * d, 3 * d, d * d, d)
        mlp = (d * ffn, ffn, ffn * d, d)
    weights = 4 * d * d + (3 if llama else 2) * d * ffn  # the matrices, biases left out
    return norm + attention + norm + mlp, (2.0 * weights + 4.0 * n_ctx * d) * n_ctx


def _bert_base() -> tuple[list[LayerSpec], int, int]:
    d, n_ctx = 768, 512
    specs: list[LayerSpec] = [("embeddings", (30522 * d, 512 * d, 2 * d, d, d), 0.0)]
    block, flops = _transformer_block(d, 4 * d, n_ctx, llama=False)
    specs += [(f"encoder.{i}", block, flops) for i in range(12)]
    specs.append(("pooler", (d * d, d), 2.0 * d * d))  # on the first token only
    return specs, n_ctx * 8, d * 4  # int64 token ids in; the pooled vector out


def _gpt2_small() -> tuple[list[LayerSpec], int, int]:
    d, n_ctx, vocab = 768, 1024, 50257
    specs: list[LayerSpec] = [("embeddings", (vocab * d, n_ctx * d), 0.0)]
    block, flops = _transformer_block(d, 4 * d, n_ctx, llama=False)
    specs += [(f"h.{i}", block, flops) for i in range(12)]
    # The output projection reuses the token embedding: FLOPs here, parameters above.
    specs.append(("ln_f+lm_head", (d, d), 2.0 * vocab * d * n_ctx))
    return specs, n_ctx * 8, n_ctx * vocab * 4


def _llama_7b() -> tuple[list[LayerSpec], int, int]:
    d, n_ctx, vocab = 4096, 2048, 32000
    specs: list[LayerSpec] = [("embed_tokens", (vocab * d,), 0.0)]
    block, flops = _transformer_block(d, 11008, n_ctx, llama=True)
    specs += [(f"layers.{i}", block, flops) for i in range(32)]
    specs.append(("norm+lm_head", (d, vocab * d), 2.0 * vocab * d * n_ctx))
    return specs, n_ctx * 8, n_ctx * vocab * 4


# name -> (builder, default per-rank batch in samples, description)
PRESET_MODELS: dict[str, tuple[Callable[[], tuple[list[LayerSpec], int, int]], int, str]] = {
    "resnet50": (_resnet50, 32, "ResNet-50, 25.6M parameters, 224x224 images"),
    "bert-base": (_bert_base, 8, "BERT-base, 110M parameters, 512-token sequences"),
    "gpt2-small": (_gpt2_small, 8, "GPT-2 small, 124M parameters, 1024-token sequences"),
    "llama-7b": (_llama_7b, 1, "LLaMA 7B, 6.7B parameters, 2048-token sequences"),
}


def preset_model(name: str, batch: int | None = None, throughput: float = DEFAULT_THROUGHPUT,
                 grad_bytes: int = 4) -> Model:
    """A preset (see the module doc) with compute times for ``batch`` samples per rank
    (the preset's default if None) at ``throughput`` FLOP/s."""
    if name not in PRESET_MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(PRESET_MODELS)}")
    build, default_batch, _ = PRESET_MODELS[name]
    batch = default_batch if batch is None else batch
    _check_batch(batch, throughput)
    specs, input_bytes, output_bytes = build()
    # A step's input and output are buffers (DataParallel scatters and gathers them): no
    # larger than a buffer's byte count can be, which keeps every time finite too.
    most = sys.maxsize // max(input_bytes, output_bytes)
    if batch > most:
        raise ValueError(f"batch must be at most {most:,} for {name} (its input and output "
                         f"of a step in at most {sys.maxsize} B each), got {batch:,}")
    return model_from_flops(name, specs, batch, throughput, grad_bytes,
                            input_bytes * batch, output_bytes * batch)


def _check_batch(batch: int, throughput: float) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    if not (isinstance(throughput, (int, float)) and not isinstance(throughput, bool)
            and throughput > 0 and math.isfinite(throughput)):
        raise ValueError(f"throughput must be a finite FLOP/s > 0, got {throughput!r}")


def model_from_flops(name: str, specs: Sequence[LayerSpec], batch: int, throughput: float,
                     grad_bytes: int = 4, input_bytes: int = 0, output_bytes: int = 0
                     ) -> Model:
    """A model from (layer name, parameter tensors, forward FLOPs per sample) triples: the
    forward takes FLOPs x batch / throughput, the backward twice that."""
    _check_batch(batch, throughput)
    layers = tuple(Layer(layer_name, tuple(params), flops * batch / throughput,
                         BACKWARD_FLOPS_RATIO * flops * batch / throughput)
                   for layer_name, params, flops in specs)
    return Model(name, layers, grad_bytes, input_bytes, output_bytes)
