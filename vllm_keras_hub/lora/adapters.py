"""KerasHub LoRA adapters as vLLM LoRA adapters, chosen per request.

vLLM loads an adapter from a PEFT folder (`adapter_config.json` and
`adapter_model.safetensors`, tensors named by the model's modules). A
KerasHub `.lora.h5` file names no modules: each layer is its position among
the backbone's layers that have weights, which is also how our model names
the vLLM linear under that layer (`layers/linear/lora_linear.py`). To convert one,
the preset's backbone is built from its config on torch's meta device (no
weights are allocated), which gives each position's layer and kernel layout.

Each layer's A and B become a standard LoRA of its kernel as the matrix
`(in, out)` vLLM multiplies by:
- a Dense layer, or an EinsumDense whose only output axis is the one B spans
  (an attention output projection), keeps rank r;
- an EinsumDense with other output axes (heads) shares B across them: the
  delta `A[..., h, :] @ B` for each head `h` is, as one matrix, A of rank
  `heads * r` and B block-diagonal, one copy of B per head. vLLM must then be
  given `--max-lora-rank` of at least `heads * r` (a query over 32 heads at
  r = 8 needs 256).
KerasHub's alpha is the rank, so the scale is 1; the folder says so per
module (`rank_pattern`, `alpha_pattern`), since the ranks differ.

Folders are written once per adapter file, preset and converter (this
module's code and KerasHub's version), under the user cache
(`$VLLM_KERAS_HUB_CACHE/lora/`), and reused.
"""

import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import tempfile

from vllm_keras_hub.lora import merged as lora
from vllm_keras_hub.lora.merged import LoraAdapterError

# vLLM's allowed `max_lora_rank` values (`vllm/config/lora.py`).
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class UnsupportedLoraError(ValueError):
    """LoRA adapters per request asked for where they cannot be served."""


def check_lora_serving(
    tensor_parallel_size,
    target_modules=None,
    fully_sharded_loras=False,
):
    """Raises unless adapters per request can be served at this size, with
    vLLM's LoRA manager wrapping the KerasHub matmuls and nothing else.

    Args:
        tensor_parallel_size: vLLM's `tensor_parallel_size`.
        target_modules: vLLM's `lora_target_modules`, the user's filter.
        fully_sharded_loras: vLLM's `fully_sharded_loras`.
    """
    if target_modules:
        # `layers/lora_linear.restrict_lora_manager` sets the filter to the
        # matmuls it hands vLLM; a user's filter names vLLM's modules, and
        # could wrap an MoE family's experts in a kernel the CPU lacks.
        raise UnsupportedLoraError(
            f"--lora-target-modules ({target_modules}) is not taken for a "
            "KerasHub preset: vllm-keras-hub hands vLLM's LoRA layers exactly "
            "the matmuls KerasHub adapters target, and each adapter applies "
            "to those it has. Serve without it."
        )
    if fully_sharded_loras and tensor_parallel_size and tensor_parallel_size > 1:
        # vLLM's S-LoRA layers all-gather each layer's shrunk rows over all
        # ranks; a KV projection replicated on every rank is not sharded.
        raise UnsupportedLoraError(
            "--fully-sharded-loras is not supported for KerasHub presets: "
            "vLLM's fully sharded LoRA layers gather every wrapped layer's "
            "shards across all tensor-parallel ranks, and a key or value "
            "projection whose heads are replicated across ranks has no such "
            "shards. Serve without it."
        )


def _meta_backbone(preset):
    """The preset's backbone with every weight on torch's meta device."""
    import keras

    from vllm_keras_hub.preset import Preset

    preset = Preset.of(preset)
    with keras.device("meta"):
        # `Backbone.from_preset`, on the loader already read.
        return preset.loader.load_backbone(preset.backbone_cls, load_weights=False)


def check_convertible(preset):
    """Raises unless adapters for `preset` can be converted when they come.

    Conversion reads the layer layout off the backbone built on torch's
    meta device; a backbone that does not build there (KerasHub 0.32's
    GPT-OSS: its layer norm makes a CPU tensor in its call) would fail every
    adapter request, so it is refused at start-up.
    """
    try:
        _meta_backbone(preset)
    except Exception as error:
        raise UnsupportedLoraError(
            "LoRA adapters per request (--enable-lora) are not supported for "
            "this preset: its backbone does not build on torch's meta device, "
            f"which converting its adapters needs ({type(error).__name__}). "
            "Merge one adapter at load instead (--lora-weights)."
        ) from error


def standard_lora(layer, rank, a, b):
    """One KerasHub layer's A and B as vLLM's `(lora_a, lora_b)`.

    Args:
        layer: A built Dense or plain-matmul EinsumDense (weights may be on
            the meta device).
        rank: The adapter's rank r.
        a: The layer's `lora_kernel_a`, the kernel's shape but the last axis
            replaced by r.
        b: Its `lora_kernel_b`, `(r, kernel.shape[-1])`.

    Returns:
        `lora_a` `(R, in)` and `lora_b` `(out, R)` float32 tensors, R the
        standard rank (r times the heads B is shared across), such that the
        kernel as the matrix `(in, out)` changes by `lora_a.T @ lora_b.T`.
    """
    import torch

    from vllm_keras_hub.layers.linear import linear

    variable, permutation, contracted_rank = linear.matmul_weight(layer)
    shape = tuple(variable.shape)
    last = len(shape) - 1
    contracted = list(permutation[:contracted_rank])
    output = list(permutation[contracted_rank:])
    if last not in output:
        raise LoraAdapterError(
            f"{layer.name}: its LoRA B spans a contracted axis of the kernel; "
            "it has no standard LoRA form."
        )
    heads = [axis for axis in output if axis != last]
    count = math.prod(shape[axis] for axis in heads)
    in_size = math.prod(shape[axis] for axis in contracted)
    a = torch.as_tensor(a, dtype=torch.float32)
    b = torch.as_tensor(b, dtype=torch.float32)
    # A's axes are the kernel's but the last, then r.
    lora_a = a.permute(*contracted, *heads, last).reshape(in_size, count * rank)
    blocks = torch.zeros(count, rank, count, shape[last])
    diagonal = torch.arange(count)
    blocks[diagonal, :, diagonal, :] = b
    order = heads + [last]
    blocks = blocks.reshape(count * rank, *(shape[axis] for axis in order))
    blocks = blocks.permute(0, *(1 + order.index(axis) for axis in output))
    lora_b = blocks.reshape(count * rank, -1)
    return lora_a.t().contiguous(), lora_b.t().contiguous()


@dataclasses.dataclass
class Converted:
    """An adapter in vLLM's form.

    Args:
        tensors: PEFT tensor names to tensors.
        ranks: Module name to its standard rank.
    """

    tensors: dict
    ranks: dict

    @property
    def max_rank(self):
        return max(self.ranks.values())


def convert(backbone, path):
    """Converts adapter file `path` for `backbone`, checking every layer.

    Args:
        backbone: The preset's backbone (its weights may be on meta).
        path: A `.lora.h5` adapter file.

    Returns:
        A `Converted`.
    """
    from vllm_keras_hub.layers.linear import kernel_readers
    from vllm_keras_hub.layers.linear import lora_linear

    rank, layers = lora.checked_layers(backbone, path)
    read_by_block = kernel_readers.kernel_read_layers(backbone)
    tensors, ranks = {}, {}
    for index, layer, a, b in layers:
        if id(layer) in read_by_block:
            raise LoraAdapterError(
                f"LoRA adapter '{path}': its layer {index} ('{layer.name}') "
                "is multiplied by its decoder block, which reads the layer's "
                "kernel instead of calling it (KerasHub's Gemma4 MLP), so no "
                "vLLM LoRA layer can stand under it. Serve adapters on the "
                "attention's layers per request, or merge this one at load "
                "(lora_weights= / --lora-weights)."
            )
        if lora_linear.servable_plan(layer) is None:
            raise LoraAdapterError(
                f"LoRA adapter '{path}': its layer {index} ('{layer.name}', "
                f"{type(layer).__name__}) is not a plain matmul, which is all "
                "vLLM's LoRA layers serve. Merge it at load instead "
                "(lora_weights= / --lora-weights)."
            )
        lora_a, lora_b = standard_lora(layer, rank, a, b)
        module = f"{lora_linear.MODULES}.{index}"
        tensors[f"base_model.model.{module}.lora_A.weight"] = lora_a
        tensors[f"base_model.model.{module}.lora_B.weight"] = lora_b
        ranks[module] = lora_a.shape[0]
    return Converted(tensors, ranks)


def _needed_rank(rank):
    return next((r for r in VLLM_MAX_LORA_RANKS if r >= rank), None)


def check_rank(converted, path, max_lora_rank):
    """Raises unless vLLM's `max_lora_rank` holds every layer's rank."""
    module, rank = max(converted.ranks.items(), key=lambda item: item[1])
    if rank <= max_lora_rank:
        return
    needed = _needed_rank(rank)
    hint = (
        f"serve with --max-lora-rank {needed} (max_lora_rank={needed})"
        if needed
        else f"vLLM's largest max_lora_rank is {VLLM_MAX_LORA_RANKS[-1]}"
    )
    raise LoraAdapterError(
        f"LoRA adapter '{path}' has rank {rank} as a standard LoRA at "
        f"{module} (an EinsumDense LoRA shares its B across the heads, so its "
        f"rank is heads x r), above max_lora_rank={max_lora_rank}: {hint}."
    )


def write_peft_folder(converted, directory):
    """Writes `converted` as the PEFT folder vLLM loads."""
    from safetensors.torch import save_file

    top = converted.max_rank
    patterns = {re.escape(module): rank for module, rank in converted.ranks.items()}
    config = {
        "peft_type": "LORA",
        "r": top,
        "lora_alpha": top,
        "target_modules": sorted({m.rsplit(".", 1)[-1] for m in converted.ranks}),
        "rank_pattern": patterns,
        # Scale 1, as KerasHub's alpha = rank.
        "alpha_pattern": patterns,
        "bias": "none",
    }
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    save_file(converted.tensors, os.path.join(directory, "adapter_model.safetensors"))


def _cache_root():
    from vllm_keras_hub.cache import default_cache_dir

    return os.path.join(default_cache_dir(), "lora")


def converter_sources():
    """The files whose code converts an adapter: this one, `lora/merged.py` (which
    reads it), and the layers that set the A/B layout and module names."""
    from vllm_keras_hub.layers.linear import linear
    from vllm_keras_hub.layers.linear import lora_linear

    return [__file__, lora.__file__, linear.__file__, lora_linear.__file__]


def _converter_digest():
    """What a converted folder depends on besides its adapter and preset."""
    import keras_hub

    digest = hashlib.sha256(keras_hub.__version__.encode())
    for source in converter_sources():
        with open(source, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def peft_folder(preset, path, max_lora_rank, cache_root=None):
    """The PEFT folder of KerasHub adapter `path` for `preset`, made once.

    Args:
        preset: The base preset, as `from_preset` takes it.
        path: A `.lora.h5` adapter file of that preset.
        max_lora_rank: vLLM's `max_lora_rank`; a larger rank fails here.
        cache_root: Where folders are kept (default: the user cache).

    Returns:
        The folder's path.

    Raises:
        LoraAdapterError: naming what does not fit (another base model, a
            rank above `max_lora_rank`, a file that is not an adapter).
    """
    from vllm_keras_hub.preset import Preset

    lora.read_adapter(path)
    # The layer layout is the backbone config's; the folder is made again
    # if either file, or the converter, changes.
    backbone_config = json.dumps(Preset.of(preset).config, sort_keys=True)
    digest = hashlib.sha256(f"{_converter_digest()}\0{backbone_config}\0".encode())
    with open(path, "rb") as f:
        digest.update(f.read())
    root = cache_root or _cache_root()
    folder = os.path.join(root, digest.hexdigest()[:32])
    if os.path.isfile(os.path.join(folder, "adapter_model.safetensors")):
        with open(os.path.join(folder, "adapter_config.json")) as f:
            patterns = json.load(f)["rank_pattern"]
        ranks = {re.sub(r"\\(.)", r"\1", k): rank for k, rank in patterns.items()}
        check_rank(Converted({}, ranks), path, max_lora_rank)
        return folder
    converted = convert(_meta_backbone(preset), path)
    check_rank(converted, path, max_lora_rank)
    os.makedirs(root, exist_ok=True)
    staging = tempfile.mkdtemp(dir=root, prefix=".tmp-")
    try:
        write_peft_folder(converted, staging)
        os.replace(staging, folder)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not os.path.isdir(folder):
            raise
    return folder


def is_keras_hub_adapter(path):
    """Whether an adapter path names a KerasHub file, not a PEFT folder."""
    return isinstance(path, str) and path.endswith(lora.ADAPTER_SUFFIX)
