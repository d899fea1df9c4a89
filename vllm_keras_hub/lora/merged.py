"""KerasHub LoRA adapters, merged into the kernels when the preset loads.

A KerasHub adapter file is what `backbone.save_lora_weights("x.lora.h5")`
writes: the rank, and for each LoRA layer its `lora_kernel_a` and
`lora_kernel_b`, keyed by the layer's position among the backbone's layers
that have weights. No layer names and no alpha are stored; KerasHub's
`enable_lora(rank)` uses alpha = rank, so the scale is 1.

Merging sets each LoRA layer's kernel to the one its own forward pass uses,
`Dense.kernel`/`EinsumDense.kernel` (the stored kernel plus A @ B, in the
compute dtype), and turns LoRA off. The layer then computes exactly what
KerasHub's LoRA forward computes, as one matmul that vLLM's CPU GEMM or
parallel linears can take over, at the base model's speed.
"""

import os

import numpy as np

ADAPTER_SUFFIX = ".lora.h5"
# The `model_loader_extra_config` key of the `keras_hub` load format.
LORA_WEIGHTS_KEY = "lora_weights"


class LoraAdapterError(ValueError):
    """A LoRA adapter file that cannot be merged into this preset."""


def read_adapter(path):
    """Reads a KerasHub `.lora.h5` adapter file.

    Args:
        path: The file `backbone.save_lora_weights` wrote.

    Returns:
        `(rank, layers)`: `layers` maps each layer position to its
        `(lora_kernel_a, lora_kernel_b)` NumPy arrays.

    Raises:
        LoraAdapterError: The file is missing, misnamed or not a KerasHub
            adapter.
    """
    import h5py

    if not os.path.isfile(path):
        raise LoraAdapterError(f"LoRA adapter file '{path}' does not exist.")
    if not str(path).endswith(ADAPTER_SUFFIX):
        raise LoraAdapterError(
            f"LoRA adapter file '{path}' does not end in '{ADAPTER_SUFFIX}', as "
            "KerasHub's `backbone.save_lora_weights` names them."
        )
    not_an_adapter = (
        f"'{path}' is not a KerasHub LoRA adapter (a file written by "
        "`backbone.save_lora_weights`)"
    )
    try:
        with h5py.File(path, "r") as f:
            store = f.get("lora")
            if store is None or "vars/rank" not in store:
                raise LoraAdapterError(f"{not_an_adapter}: it has no 'lora/vars/rank'.")
            rank = int(store["vars/rank"][()])
            layers = {}
            for key in store:
                if key == "vars":
                    continue
                group = store[key].get("vars")
                factors = None if group is None else set(group)
                if not key.isdigit() or factors != {"lora_kernel_a", "lora_kernel_b"}:
                    raise LoraAdapterError(f"{not_an_adapter}: unexpected entry 'lora/{key}'.")
                layers[int(key)] = (group["lora_kernel_a"][()], group["lora_kernel_b"][()])
    except OSError as error:
        raise LoraAdapterError(f"{not_an_adapter}: {error}.") from error
    if rank < 1 or not layers:
        raise LoraAdapterError(f"{not_an_adapter}: rank {rank}, {len(layers)} layers.")
    return rank, layers


def adapter_loader_config(path, extra_config=None):
    """The `model_loader_extra_config` that merges adapter `path` at load.

    Reads the file first, so that a bad one fails before an engine starts.

    Args:
        path: A `.lora.h5` adapter file.
        extra_config: The `model_loader_extra_config` given, if any.
    """
    read_adapter(path)
    return {**(extra_config or {}), LORA_WEIGHTS_KEY: os.path.abspath(path)}


def weighted_layers(backbone):
    """The backbone's layers that have weights, in the order adapter files
    index them (`Backbone.save_lora_weights`)."""
    return [layer for layer in backbone._flatten_layers(include_self=False) if layer.weights]


def checked_layers(backbone, path):
    """The layers of `backbone` adapter `path` names, each checked.

    A layer is found by its position among the layers that have weights, as
    KerasHub's `load_lora_weights` finds it, and must be a Dense or
    EinsumDense whose kernel shape fits the file's rank-r A and B.

    Returns:
        `(rank, [(index, layer, a, b), ...])`.

    Raises:
        LoraAdapterError: naming the layer, for an adapter of another base.
    """
    rank, layers = read_adapter(path)
    weighted = weighted_layers(backbone)
    checked = []
    for index, (a, b) in sorted(layers.items()):
        layer = weighted[index] if index < len(weighted) else None
        kernel = getattr(layer, "_kernel", None)
        if kernel is None or not hasattr(layer, "enable_lora") or layer.lora_enabled:
            raise LoraAdapterError(
                f"LoRA adapter '{path}' was not saved from this base model: its "
                f"layer {index} is not a LoRA-capable Dense or EinsumDense layer "
                f"of {type(backbone).__name__} ({len(weighted)} layers with "
                "weights)."
            )
        shape = tuple(kernel.shape)
        expected = (shape[:-1] + (rank,), (rank, shape[-1]))
        if (a.shape, b.shape) != expected:
            raise LoraAdapterError(
                f"LoRA adapter '{path}' was not saved from this base model: layer "
                f"{index} ('{layer.name}', kernel {shape}) needs rank-{rank} "
                f"A {expected[0]} and B {expected[1]}, the file has {a.shape} "
                f"and {b.shape}."
            )
        checked.append((index, layer, a, b))
    return rank, checked


def load_adapter(backbone, path, weights=None):
    """Enables LoRA on the adapter's layers of `backbone` and loads A and B.

    The layers are the ones the file names by position, as KerasHub's
    `load_lora_weights` finds them, whatever `target_layer_names` the
    adapter was trained with. Every shape is checked before anything is
    changed, so an adapter of another base model fails with the cause.

    Args:
        backbone: A built KerasHub backbone.
        path: A `.lora.h5` adapter file.
        weights: The backbone's `PresetWeights`, if it is loading: the
            adapter's layers are read from the preset first, and layers
            this rank does not hold (another pipeline stage's) are skipped.

    Returns:
        The adapter's rank.
    """
    rank, planned = checked_layers(backbone, path)
    for _, layer, a, b in planned:
        if weights is not None:
            if weights.released(layer._kernel):
                continue
            weights.materialize(layer.variables)
        layer.enable_lora(rank)
        layer.lora_kernel_a.assign(np.asarray(a))
        layer.lora_kernel_b.assign(np.asarray(b))
    return rank


def merge_lora(backbone):
    """Merges every LoRA-enabled layer of `backbone` into its kernel.

    A layer whose kernel is quantized or stored in another dtype than it
    computes in keeps its LoRA unmerged (Keras's own, slower matmul), since
    the merged kernel would not round-trip exactly.

    Args:
        backbone: A built KerasHub backbone.

    Returns:
        The number of layers merged.
    """
    merged = 0
    for layer in backbone._flatten_layers(include_self=False):
        if not getattr(layer, "lora_enabled", False):
            continue
        if layer.quantization_mode is not None or layer._kernel.dtype != layer.compute_dtype:
            continue
        kernel = layer.kernel
        layer.lora_enabled = False
        layer._kernel.assign(kernel)
        merged += 1
    return merged
