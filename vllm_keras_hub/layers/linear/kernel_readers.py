"""Decoder blocks that multiply by their MLP kernels themselves.

Some decoder blocks do not call their feed-forward layers: they read their
kernels (`ops.matmul(x, self.gating_ffw.kernel)`, a KerasHub workaround for
a graph-tracer bug); each family names its own (`Family.kernel_readers`).
So no vLLM layer can stand under those layers' calls:
tensor parallelism slices the kernels in place (`parallel_mlp.py`), and LoRA
adapters per request leave those layers out (`lora_linear.py`).

On the CPU the kernels still reach vLLM's packed GEMM (`linear.py`):
`route_matmuls` runs each such block's own `call`, the same code object,
with its `ops` bound to a copy of `keras.ops` whose `matmul` hands a packed
weight to vLLM's GEMM and anything else to Keras. A packed layer's `kernel`
then reads as its packed weight, which only that `matmul` can multiply by.
"""

import functools
import sys
import types

from keras import ops as keras_ops

from vllm_keras_hub import families

# Decoder block class -> (its gate and up projections, its down projection).
BLOCKS = families.KERNEL_READERS


def reads_kernels(block):
    """Whether `block` multiplies by its MLP's kernels itself."""
    return type(block).__name__ in BLOCKS


def kernel_read_layers(model):
    """The ids of `model`'s layers whose kernels their block multiplies by."""
    found = set()
    for block in model._flatten_layers(include_self=False):
        if reads_kernels(block):
            columns, row = BLOCKS[type(block).__name__]
            found.update(id(getattr(block, name)) for name in (*columns, row))
    return found


def route_matmuls(model, packed_type, packed_matmul):
    """Runs the kernel-reading blocks' `ops.matmul` by a packed weight on it.

    Args:
        model: A built Keras model.
        packed_type: The type a packed layer's `kernel` reads as.
        packed_matmul: `packed_matmul(packed, x)` multiplies `x` by a
            `packed_type` weight.

    Returns:
        The number of blocks routed.
    """
    ops = _routed_ops(packed_type, packed_matmul)
    routed = 0
    for block in model._flatten_layers(include_self=False):
        if reads_kernels(block) and not getattr(block, "_matmuls_routed", False):
            block.__class__ = _routed_class(type(block), ops)
            block._matmuls_routed = True
            routed += 1
    return routed


@functools.cache
def _routed_ops(packed_type, packed_matmul):
    """`keras.ops`, but for `matmul` by a `packed_type` weight."""
    ops = types.ModuleType(f"{__name__}.ops")
    ops.__dict__.update(
        (name, value) for name, value in vars(keras_ops).items() if not name.startswith("__")
    )

    def matmul(x1, x2):
        if isinstance(x2, packed_type):
            return packed_matmul(x2, x1)
        return keras_ops.matmul(x1, x2)

    ops.matmul = matmul
    return ops


@functools.cache
def _routed_class(cls, ops):
    call = _keras_hub_call(cls)
    if "ops" not in call.__code__.co_names:
        raise TypeError(f"{cls.__name__}.call reads no `ops`.")
    # The globals are a module's (torch.compile resolves a function's
    # globals by the `__name__` they hold), a copy of KerasHub's with `ops`.
    name = f"{__name__}.routed.{call.__module__}"
    module = types.ModuleType(name)
    module.__dict__.update(call.__globals__)
    module.__dict__.update(__name__=name, ops=ops)
    sys.modules[name] = module
    routed = types.FunctionType(
        call.__code__,
        module.__dict__,
        call.__name__,
        call.__defaults__,
        call.__closure__,
    )
    routed.__kwdefaults__ = call.__kwdefaults__
    return type(cls.__name__, (cls,), {"call": routed, "__module__": cls.__module__})


def _keras_hub_call(cls):
    """The `call` KerasHub defines for `cls`, which nothing may have replaced."""
    for base in cls.__mro__:
        if base.__module__.startswith("keras_hub.") and "call" in vars(base):
            if cls.call is not base.call:
                raise TypeError(f"{cls.__name__}.call is no longer KerasHub's.")
            return base.call
    raise TypeError(f"{cls.__name__} has no KerasHub `call`.")
