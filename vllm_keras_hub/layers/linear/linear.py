"""Run KerasHub's matmul layers on vLLM's CPU GEMM.

Keras keeps a kernel as an `(in, out)` tensor and multiplies it with aten's
`mm`. vLLM's own CPU models prepack each weight once, at load, for the
kernel library `dispatch_cpu_unquantized_gemm` picks for the CPU (oneDNN;
zentorch on AMD Zen; sgl-kernel for small AMX weights). On this machine
oneDNN took 4 to 58% less time than aten for a 576 x 1536 weight at 1 to
256 rows (one thread), and matmuls are most of a decode step.

`use_vllm_cpu_gemm(model, step)` hands each plain-matmul Dense/EinsumDense
kernel, and an untied output embedding, to that dispatch and then frees
Keras's copy, so the weights are held once, in the packed layout (or,
where vLLM's own layers fall back to torch's linear, in theirs). The
layers' bias, activation, soft cap and output shape stay Keras's.

A tied output embedding keeps Keras's table for its lookup and projects on
a packed copy beside it (`tied_output.py`).
"""

import functools
import math

import torch
from keras import ops

from vllm_keras_hub.compile.direct_calls import direct_call
from vllm_keras_hub.layers.linear import kernel_readers
from vllm_keras_hub.layers.linear import onednn
from vllm_keras_hub.layers.linear import tied_output
from vllm_keras_hub.loading import heap

_GEMM_CLASSES = {}


class _PackedKernel:
    """A weight held by a vLLM GEMM, and how a layer's input meets it.

    `matmul(x)` multiplies `(rows, in_size)` by the weight: vLLM's packed CPU
    GEMM, or one of vLLM's parallel linear layers (`parallel_linear.py`).
    """

    def __init__(self, matmul, in_size, contracted_rank, out_shape):
        self.matmul = matmul
        self.in_size = in_size
        self.contracted_rank = contracted_rank
        self.out_shape = out_shape
        # Whether code other than the layer's own call read its weight, and
        # whether Keras's copy is gone.
        self.read = False
        self.freed = False

    def __array__(self, *args, **kwargs):
        raise RuntimeError(
            "A weight on vLLM's CPU GEMM is multiplied only by its layer's call "
            "or its decoder block's `ops.matmul` (`kernel_readers.py`)."
        )


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


def matmul_weight(layer):
    """The weight a built layer's call multiplies its input by, if plain.

    Returns:
        `(variable, permutation, contracted_rank)` as in `matmul_plan`, or
        `None`: Dense, plain-matmul EinsumDense, and an untied
        ReversibleEmbedding's output projection have one (a tied one's
        weight is also the input embedding).
    """
    from keras.layers import Dense
    from keras.layers import EinsumDense
    from keras.layers import ReversibleEmbedding

    if isinstance(layer, ReversibleEmbedding):
        if layer.tie_weights or layer.reverse_dtype is not None:
            return None
        return layer.reverse_embeddings, (0, 1), 1
    if isinstance(layer, Dense):
        return layer._kernel, (0, 1), 1
    if isinstance(layer, EinsumDense):
        plan = matmul_plan(layer.equation)
        return None if plan is None else (layer._kernel, *plan)
    return None


def _packed_matmul(self, inputs):
    return packed_rows(self._packed_kernel, inputs)


def packed_rows(packed, inputs):
    """`inputs` times the `_PackedKernel` `packed`, over its trailing axes."""
    batch_shape = inputs.shape[: inputs.ndim - packed.contracted_rank]
    rows = inputs.reshape(-1, packed.in_size)
    # vLLM's oneDNN GEMM needs unit-stride rows; a vision encoder hands
    # some layers transposed (strided) activations.
    if not rows.is_contiguous():
        rows = rows.contiguous()
    x = packed.matmul(rows)
    return x.reshape(*batch_shape, *packed.out_shape)


def _gemm_direct_call(self, *args, **kwargs):
    # The whole of a packed Dense/EinsumDense call in one short frame: the
    # input cast Keras's `__call__` makes (`compile/direct_calls.py`), the
    # matmul, the bias and activation Keras's `call` adds. Each line of
    # Python here is traced once per layer per compile.
    if len(args) != 1 or kwargs.keys() - {"training"} or not self.built:
        return self._keras_direct_call(*args, **kwargs)
    (inputs,) = args
    dtype = self._direct_input_dtype
    if dtype is not None and inputs.dtype != dtype and inputs.is_floating_point():
        inputs = inputs.to(dtype)
    x = _packed_matmul(self, inputs)
    if self.bias is not None:
        x = ops.add(x, self.bias)
    if self.activation is not None:
        x = self.activation(x)
    return x


def _dense_call(self, inputs, training=None):
    x = _packed_matmul(self, inputs)
    if self.bias is not None:
        x = ops.add(x, self.bias)
    if self.activation is not None:
        x = self.activation(x)
    return x


def _reversible_embedding_call(self, inputs, reverse=False):
    if not reverse:
        return self._keras_layer_call(inputs)
    return tied_output.soft_capped(self, _packed_matmul(self, inputs))


def _cpu_gemm(linear, x):
    return linear.cpu_linear(x, None, None)


def use_packed_kernel(
    layer, matmul, in_size, contracted_rank, out_shape, read_by_block=False
):
    """Makes `layer`'s call multiply by `matmul` instead of its own kernel.

    The layer's bias, activation and soft cap stay its own; reads of its
    kernel are recorded (and refused once it is freed).

    Args:
        layer: A layer `matmul_weight` gives a weight for.
        matmul: Multiplies `(rows, in_size)` by the weight.
        in_size: The contracted size.
        contracted_rank: How many trailing input axes are contracted.
        out_shape: The output's trailing axes.
        read_by_block: Whether its decoder block multiplies by its kernel
            (`kernel_readers.py`): the kernel then reads as the packed weight.
    """
    layer._packed_kernel = _PackedKernel(matmul, in_size, contracted_rank, out_shape)
    layer.__class__ = _gemm_class(type(layer), read_by_block)


def _guarded_weight(keras_getter):
    """A property that records reads of a packed weight, or refuses them."""

    def get(self):
        if self._packed_kernel.freed:
            raise RuntimeError(
                f"{self.name}'s weight was moved to vLLM's CPU GEMM; "
                "the served model no longer holds it."
            )
        self._packed_kernel.read = True
        return keras_getter(self)

    return property(get)


def _gemm_class(cls, read_by_block=False):
    from keras.layers import ReversibleEmbedding

    if (cls, read_by_block) not in _GEMM_CLASSES:
        if issubclass(cls, ReversibleEmbedding):
            methods = {
                "call": _reversible_embedding_call,
                "_keras_layer_call": cls.call,
                # An instance attribute; the class property takes precedence.
                "reverse_embeddings": _guarded_weight(
                    lambda self: self.__dict__["reverse_embeddings"]
                ),
            }
        else:
            kernel = _guarded_weight(cls.kernel.fget)
            if read_by_block:
                # What its block's routed `ops.matmul` multiplies by.
                kernel = property(lambda self: self._packed_kernel)
            methods = {"call": _dense_call, "kernel": kernel}
            if cls.__call__ is direct_call:
                methods.update(__call__=_gemm_direct_call, _keras_direct_call=direct_call)
        _GEMM_CLASSES[cls, read_by_block] = type(
            cls.__name__, (cls,), {**methods, "__module__": cls.__module__}
        )
    return _GEMM_CLASSES[cls, read_by_block]


def _pack(matrix):
    """Hands an `(in, out)` matrix to vLLM's CPU GEMM dispatch.

    Where the dispatch cannot prepack (oneDNN's bfloat16 matmul needs
    AVX-512 BF16 or AMX), vLLM's own layers keep their contiguous
    `(out, in)` weight for `torch.nn.functional.linear`; so does this. On an
    AVX2 CPU that is 7x faster in bfloat16 than Keras's `mm` on its `(in,
    out)` kernel (0.17 against 1.2 ms for 512 x 1536 at one row).

    Returns:
        `linear(x, weight, bias)` over the prepacked or contiguous weight; a
    oneDNN-packed one as `_OneDNNLinear`.
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    linear = torch.nn.Module()
    # Contiguous `(out, in)`, as vLLM's own layers hold it: the dispatch's
    # sgl-kernel path (small bfloat16 weights on AMX CPUs) packs only a
    # contiguous weight ("weight must be contiguous").
    linear.weight = torch.nn.Parameter(matrix.t().contiguous(), requires_grad=False)
    dispatch_cpu_unquantized_gemm(linear, remove_weight=True)
    if linear.weight.numel() != 0:
        weight = linear.weight.data
        return lambda x: torch.nn.functional.linear(x, weight)
    return onednn.functional(linear.cpu_linear) or functools.partial(_cpu_gemm, linear)


def _keras_matmul(variable, permutation, in_size):
    # Keras's own kernel behind the packed call path, read without the
    # guard: only reads from outside a layer's call are recorded.
    def matmul(rows):
        kernel = variable.value.detach().permute(permutation)
        return rows @ kernel.reshape(in_size, -1)

    return matmul


def use_vllm_cpu_gemm(model, step):
    """Moves a built model's plain matmul weights to vLLM's CPU GEMM.

    These are the kernels of Dense and plain-matmul EinsumDense layers and
    an untied ReversibleEmbedding's output projection. Layers that are
    quantized, have LoRA enabled, are not built, or whose weight dtype
    differs from their compute dtype keep Keras's matmul. So do layers whose
    weight other code reads: `step` runs once with every candidate on the
    packed call path but still multiplying by Keras's kernel, and any
    weight read outside its layer's call stays with Keras (except a
    Gemma4 MLP's: its decoder block's `ops.matmul` is routed to the packed
    weights, `kernel_readers.py`). The others are then packed and Keras's
    copy freed one weight at a time, so loading
    holds one extra weight, not a second copy of them all. A moved weight
    can no longer be read, so the model can serve but not train, save or be
    quantized.

    A tied ReversibleEmbedding keeps its table for the lookup and projects
    on a packed copy beside it, as vLLM's own CPU models hold a tied head;
    it is not counted as moved.

    Args:
        model: A built Keras model on the torch backend, on the CPU.
        step: Runs one forward step of `model` the way serving will.

    Returns:
        The number of layers moved.
    """
    read_by_block = kernel_readers.kernel_read_layers(model)
    kernel_readers.route_matmuls(model, _PackedKernel, packed_rows)
    chosen = []
    for layer in model._flatten_layers(include_self=True):
        if not layer.built or hasattr(layer, "_packed_kernel"):
            continue
        if tied_output.use_packed_head(layer, _pack):
            continue
        weight = matmul_weight(layer)
        if weight is None:
            continue
        if getattr(layer, "quantization_mode", None) is not None:
            continue
        if getattr(layer, "lora_enabled", False):
            continue
        if weight[0].dtype != layer.compute_dtype:
            continue
        if weight[0].value.numel() == 0:
            # Held by a vLLM parallel linear, or by another pipeline stage.
            continue
        chosen.append((layer, weight))
    routed = []
    for layer, (variable, permutation, contracted_rank) in chosen:
        # The tensor's own shape: a tensor-parallel rank may hold a slice
        # of it in place (`parallel_mlp.py`).
        shape = tuple(variable.value.shape[axis] for axis in permutation)
        in_size = math.prod(shape[:contracted_rank])
        keras_class = type(layer)
        use_packed_kernel(
            layer,
            _keras_matmul(variable, permutation, in_size),
            in_size,
            contracted_rank,
            shape[contracted_rank:],
            id(layer) in read_by_block,
        )
        routed.append((layer, keras_class, variable, permutation))
    step()
    # A variable two layers share stays if either layer's weight was read.
    read = {
        id(variable)
        for layer, _, variable, _ in routed
        if layer._packed_kernel.read
    }
    moved = 0
    packs = {}
    for layer, keras_class, variable, permutation in routed:
        if id(variable) in read:
            layer.__class__ = keras_class
            del layer._packed_kernel
            continue
        packed = layer._packed_kernel
        if id(variable) not in packs:
            kernel = variable.value.detach().permute(permutation)
            packs[id(variable)] = _pack(kernel.reshape(packed.in_size, -1))
            del kernel
            variable.value.data = torch.empty(0, dtype=variable.value.dtype)
            # Keras's copy may sit in the heap, where a packed weight (of
            # another size) cannot reuse it: give its pages back now.
            heap.release_free_memory()
        packed.matmul = packs[id(variable)]
        packed.freed = True
        moved += 1
    return moved
