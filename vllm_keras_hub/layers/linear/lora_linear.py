"""vLLM linear layers under KerasHub's matmuls, for vLLM's multi-LoRA.

vLLM serves many LoRA adapters in one batch by wrapping its own linear
layers: its `LoRAModelManager` replaces each `LinearBase` in the model's
`named_modules()` with a `*WithLoRA` layer, which adds each token's adapter
through the punica ops. Keras sublayers are not among those modules, so with
`--enable-lora` every LoRA-capable KerasHub matmul (a Dense or plain-matmul
EinsumDense layer) multiplies through a vLLM `ReplicatedLinear` holding its
kernel, registered as `lora_layers.<i>`: `i` is the layer's position among
the backbone's layers that have weights, the index KerasHub's `.lora.h5`
files use (`lora/adapters.py` converts a file to vLLM's tensors under those
names). The layer's bias, activation and output shape stay Keras's, and on
the CPU the base matmul is vLLM's (prepacked where its CPU GEMM packs the
dtype; unpacked `F.linear` in bfloat16 on an AVX2-only CPU).

Under tensor parallelism a sharded matmul already runs on a vLLM
`ColumnParallelLinear` or `RowParallelLinear` (`parallel_linear.py`): that
layer is registered under the same name instead, and vLLM's LoRA manager
wraps it in its `*ParallelLinearWithLoRA`, which cuts each adapter's full B
(column) or A (row) to the rank's shard by the base layer's own rank and
size. A KV projection replicated on several ranks is a one-shard layer, so
its adapter stays whole there, as its kernel does.
"""

import functools
import math

import torch

from vllm_keras_hub.layers.linear import kernel_readers
from vllm_keras_hub.layers.linear import linear
from vllm_keras_hub.lora import merged as lora

MODULES = "lora_layers"


def servable_plan(layer):
    """`(variable, permutation, contracted_rank)` of a layer vLLM's LoRA can
    wrap, or `None`: a built, unquantized Dense or plain-matmul EinsumDense
    that KerasHub can put a LoRA on, computing in its kernel's dtype.
    (An embedding's LoRA changes its lookup, which is not a matmul.)"""
    from keras.layers import Dense
    from keras.layers import EinsumDense

    if not isinstance(layer, (Dense, EinsumDense)) or layer.lora_enabled:
        return None
    plan = linear.matmul_weight(layer)
    if plan is None or getattr(layer, "quantization_mode", None) is not None:
        return None
    variable = plan[0]
    if variable.dtype != layer.compute_dtype or variable.value.numel() == 0:
        return None
    return plan


def _sharded_linear(layer):
    """The vLLM parallel linear a sharded `layer` multiplies by, or `None`."""
    from vllm.model_executor.layers.linear import LinearBase

    packed = getattr(layer, "_packed_kernel", None)
    if packed is not None and isinstance(packed.matmul, LinearBase):
        return packed.matmul
    return None


def _call(modules, key, x):
    # Looked up per call: vLLM's LoRA manager replaces the module in place.
    return modules[key](x)


def build(backbone, prefix):
    """Moves every LoRA-capable matmul of `backbone` onto a vLLM linear.

    Call inside `set_current_vllm_config`, after any LoRA adapter merged at
    load, and after tensor-parallel sharding: a sharded matmul keeps its
    vLLM parallel linear. Keras's copy of each kernel is freed.

    Args:
        backbone: A built KerasHub backbone.
        prefix: Name prefix of the vLLM layers.

    Returns:
        A `torch.nn.ModuleDict` of the `ReplicatedLinear`s, keyed by each
        layer's adapter-file index, to register as the model's
        `lora_layers`.
    """
    from vllm.model_executor.layers.linear import ReplicatedLinear

    modules = torch.nn.ModuleDict()
    read_by_block = kernel_readers.kernel_read_layers(backbone)
    for index, layer in enumerate(lora.weighted_layers(backbone)):
        sharded = _sharded_linear(layer)
        if sharded is not None:
            modules[str(index)] = sharded
            layer._packed_kernel.matmul = functools.partial(_call, modules, str(index))
            continue
        if id(layer) in read_by_block:
            continue
        plan = servable_plan(layer)
        if plan is None:
            continue
        variable, permutation, contracted_rank = plan
        kernel = variable.value.detach().permute(permutation)
        in_size = math.prod(kernel.shape[:contracted_rank])
        out_shape = tuple(kernel.shape[contracted_rank:])
        key = str(index)
        vllm_linear = ReplicatedLinear(
            in_size,
            math.prod(out_shape),
            bias=False,
            params_dtype=kernel.dtype,
            prefix=f"{prefix}{MODULES}.{key}",
            return_bias=False,
        )
        vllm_linear.weight.weight_loader(
            vllm_linear.weight, kernel.reshape(in_size, -1).t()
        )
        vllm_linear.quant_method.process_weights_after_loading(vllm_linear)
        modules[key] = vllm_linear
        linear.use_packed_kernel(
            layer,
            functools.partial(_call, modules, key),
            in_size,
            contracted_rank,
            out_shape,
        )
        variable.value.data = torch.empty(0, dtype=variable.value.dtype)
        layer._packed_kernel.freed = True
    return modules


def other_stages_prefixes(backbone, stage_layers):
    """vLLM's `lora_skip_prefixes` for a pipeline stage: the adapter modules
    of every weighted layer outside `stage_layers`.

    vLLM's LoRA manager refuses an adapter naming a module the model lacks
    (`LoRAModel.from_local_checkpoint`), and a stage holds only its own
    layers' LoRA layers; an adapter is converted once for all stages, so
    each stage skips the other stages' modules.

    Args:
        backbone: The backbone, as `build` was given it.
        stage_layers: This stage's transformer layers.
    """
    own = {
        id(layer)
        for block in stage_layers
        for layer in block._flatten_layers(include_self=True)
    }
    return [
        f"{MODULES}.{index}."
        for index, layer in enumerate(lora.weighted_layers(backbone))
        if id(layer) not in own
    ]


def restrict_lora_manager(lora_config, layers):
    """Makes vLLM's LoRA manager wrap `layers` (`build`'s) and nothing else.

    Its `target_modules` filter takes full module names: with it, modules
    outside them (an MoE family's `FusedMoE` experts, which KerasHub
    adapters never target, and the vocabulary-parallel head and lookup under
    tensor parallelism) stay unwrapped. A user's own
    `--lora-target-modules` is refused at start-up
    (`lora.adapters.check_lora_serving`).

    Args:
        lora_config: The engine's `LoRAConfig`.
        layers: The `ModuleDict` registered as the model's `lora_layers`.
    """
    lora_config.target_modules = [f"{MODULES}.{key}" for key in layers]
