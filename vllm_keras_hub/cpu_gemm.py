"""Run KerasHub's Dense and EinsumDense matmuls on vLLM's CPU GEMM.

Keras keeps a kernel as an `(in, out)` tensor and multiplies it with aten's
`mm`. vLLM's own CPU models prepack each weight once, at load, for the
kernel library `dispatch_cpu_unquantized_gemm` picks for the CPU (oneDNN;
zentorch on AMD Zen; sgl-kernel for small AMX weights). On this machine
oneDNN took 4 to 58% less time than aten for a 576 x 1536 weight at 1 to
256 rows (one thread), and matmuls are most of a decode step.

`use_vllm_cpu_gemm(model, step)` hands each plain-matmul Dense/EinsumDense
kernel to that dispatch and then frees Keras's copy, so the weights are held
once, in the packed layout. The layers' bias, activation and output shape
stay Keras's.
"""

import math

import torch
from keras import ops

_GEMM_CLASSES = {}


class _PackedKernel:
    """A kernel held by vLLM's CPU GEMM, and how a layer's input meets it."""

    def __init__(self, linear, in_size, contracted_rank, out_shape):
        self.linear = linear
        self.in_size = in_size
        self.contracted_rank = contracted_rank
        self.out_shape = out_shape
        # Whether code other than the layer's own call read its kernel, and
        # whether Keras's copy is gone.
        self.read = False
        self.freed = False


def matmul_plan(equation):
    """How an EinsumDense equation is `x @ W`, if it is.

    It is when the input's trailing axes are the contracted ones and the
    output is the input's leading axes followed by the kernel's other axes:
    `btd,dnh->btnh`, `btnh,nhd->btd`, or with the kernel's axes in another
    order, `btd,ndh->btnh` (Gemma). The kernel is then the matrix `W` after
    a transpose and a reshape.

    Args:
        equation: An `EinsumDense` equation.

    Returns:
        `(permutation, contracted_rank)`: the kernel axes in `W`'s order,
        contracted ones first, and how many are contracted. `None` when the
        equation is not a plain matmul.
    """
    inputs, output = equation.replace(" ", "").split("->")
    lhs, rhs = inputs.split(",")
    if lhs.startswith("...") and output.startswith("..."):
        lhs, output = lhs[3:], output[3:]
    terms = (lhs, rhs, output)
    if not "".join(terms).isalpha() or any(len(set(t)) != len(t) for t in terms):
        return None
    batch = lhs.rstrip(rhs)
    contracted = lhs[len(batch) :]
    free = output[len(batch) :]
    if not contracted or not free or not output.startswith(batch):
        return None
    if sorted(rhs) != sorted(contracted + free):
        return None
    permutation = tuple(rhs.index(axis) for axis in contracted + free)
    return permutation, len(contracted)


def _kernel_plan(layer):
    """`matmul_plan` of a Dense or EinsumDense layer, else `None`."""
    from keras.layers import Dense
    from keras.layers import EinsumDense

    if isinstance(layer, Dense):
        return (0, 1), 1
    if isinstance(layer, EinsumDense):
        return matmul_plan(layer.equation)
    return None


def _gemm_call(self, inputs, training=None):
    packed = self._packed_kernel
    batch_shape = inputs.shape[: inputs.ndim - packed.contracted_rank]
    x = packed.linear(inputs.reshape(-1, packed.in_size), None, None)
    x = x.reshape(*batch_shape, *packed.out_shape)
    if self.bias is not None:
        x = ops.add(x, self.bias)
    if self.activation is not None:
        x = self.activation(x)
    return x


def _kernel_of_gemm_layer(self):
    if self._packed_kernel.freed:
        raise RuntimeError(
            f"{self.name}'s kernel was moved to vLLM's CPU GEMM; "
            "the served model no longer holds it."
        )
    self._packed_kernel.read = True
    return self._keras_kernel()


def _gemm_class(cls):
    if cls not in _GEMM_CLASSES:
        _GEMM_CLASSES[cls] = type(
            cls.__name__,
            (cls,),
            {
                "call": _gemm_call,
                "kernel": property(_kernel_of_gemm_layer),
                "_keras_kernel": cls.kernel.fget,
                "__module__": cls.__module__,
            },
        )
    return _GEMM_CLASSES[cls]


def _pack(matrix):
    """Prepacks an `(in, out)` matrix with vLLM's CPU GEMM dispatch.

    Returns:
        The packed `linear(x, weight, bias)`, or `None` when the dispatch
        picked plain `torch.nn.functional.linear`, which would need Keras's
        copy kept.
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    linear = torch.nn.Module()
    linear.weight = torch.nn.Parameter(matrix.t(), requires_grad=False)
    dispatch_cpu_unquantized_gemm(linear, remove_weight=True)
    if linear.weight.numel() != 0:
        return None
    return linear.cpu_linear


def use_vllm_cpu_gemm(model, step):
    """Moves a built model's plain Dense/EinsumDense kernels to vLLM's CPU GEMM.

    Layers that are quantized, have LoRA enabled, are not built, or whose
    kernel dtype differs from their compute dtype keep Keras's matmul. So do
    layers whose kernel other code reads (Gemma4's MoE block multiplies its
    feed-forward kernels itself): `step` runs once with every candidate
    moved and Keras's copies still there, and any kernel read outside its
    layer's call stays with Keras. The other Keras copies are then freed; a
    moved layer's kernel can no longer be read, so the model can serve but
    not train, save or be quantized.

    Args:
        model: A built Keras model on the torch backend, on the CPU.
        step: Runs one forward step of `model` the way serving will.

    Returns:
        The number of layers moved.
    """
    chosen = []
    for layer in model._flatten_layers(include_self=True):
        plan = _kernel_plan(layer)
        if plan is None or not layer.built:
            continue
        if getattr(layer, "quantization_mode", None) is not None:
            continue
        if getattr(layer, "lora_enabled", False):
            continue
        if layer._kernel.dtype != layer.compute_dtype:
            continue
        chosen.append((layer, plan))
    packed = []
    for layer, (permutation, contracted_rank) in chosen:
        kernel = layer._kernel.value.detach().permute(permutation)
        in_size = math.prod(kernel.shape[:contracted_rank])
        linear = _pack(kernel.reshape(in_size, -1))
        if linear is None:
            continue
        out_shape = tuple(kernel.shape[contracted_rank:])
        layer._packed_kernel = _PackedKernel(
            linear, in_size, contracted_rank, out_shape
        )
        keras_class = type(layer)
        layer.__class__ = _gemm_class(keras_class)
        packed.append((layer, keras_class))
    step()
    # A variable two layers share stays if either layer's kernel was read.
    read = {id(layer._kernel) for layer, _ in packed if layer._packed_kernel.read}
    moved = 0
    for layer, keras_class in packed:
        if id(layer._kernel) in read:
            layer.__class__ = keras_class
            del layer._packed_kernel
            continue
        variable = layer._kernel
        variable.value.data = torch.empty(0, dtype=variable.value.dtype)
        layer._packed_kernel.freed = True
        moved += 1
    return moved
