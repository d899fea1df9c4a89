"""What Dynamo traces in place of Keras helpers that cost a served step.

vLLM's compiled mode traces a KerasHub step with Dynamo, and Dynamo traces
every Python line of every `keras.ops` call. Two helpers that each op runs
cost about 40% of that trace and half of the resulting graph, while
deciding nothing in a served step:

- `any_symbolic_tensors(args, kwargs)` flattens an op's arguments with
  Keras's tree utilities to find KerasTensors. A traced step has none (they
  exist only while a functional model is built), so the answer is `False`.
- torch's `convert_to_tensor(x)` compares `x.device`, a `torch.device`, with
  Keras's device, a string. The two never compare equal, so every tensor
  argument gets a `.to(device)` that returns it unchanged (a Keras
  inefficiency, in eager too). Traced, each adds nodes to the graph that
  AOTAutograd and Inductor then process.

A third keeps the token count dynamic:

- torch's `take_along_axis(x, indices, axis)` calls `torch.take_along_dim`,
  which broadcasts the two shapes; traced with a dynamic token count,
  that specializes it to the traced step's size (Gemma4's MoE router
  gathers its top-k probabilities this way), and vLLM's compile fails.
  Where the shapes already agree off `axis` (no broadcast), the substitute
  is `torch.gather`, the same values.

Another lets Dynamo trace a layer with nested outputs:
- Keras's `tree.flatten` (its torch implementation) compares tuples with
  `is not`, which Dynamo does not trace; a functional model flattens each
  layer's outputs, and T5Gemma's decoder layers return `(output, (cache,
  cache))`. The substitute flattens lists, tuples and tensors in Keras's
  order, and hands anything else to Keras.
A fourth changes the compiled kernels, not the trace:

- torch's `power(x1, x2)` makes a Python exponent a 0-d tensor. Inductor
  then computes `ops.power(x, 2)` (the RMS norm of Llama-family layers)
  with a general vectorized `pow` instead of `x * x`: each such norm
  kernel took about 75 us a step, against 15 us for native's (SmolLM2,
  bfloat16, the average over a run of 32 requests).

And three are not traced at all:

- `standardize_dtype`, `result_type` and torch's `to_torch_dtype` map
  dtypes to dtypes through Keras's promotion lattice, once per op (its
  `lru_cache` is ignored by Dynamo, which traced the lattice every time).
  Their answers depend only on their constant arguments and the process's
  Keras config, which serving never changes, so Dynamo calls them at trace
  time and keeps the result (`torch.compiler.assume_constant_result`).

`substitute_keras_helpers()` registers, with
`torch.compiler.substitute_in_graph`, versions that Dynamo traces instead.
The results are the same: a tensor or Variable already on Keras's device is
returned as Keras returns it, and anything else (a Python scalar, a list,
another device) goes through Keras's own code. A floating tensor raised to
a Python number gets `torch.pow(x, number)`, with Keras's result dtype.
Outside Dynamo, Keras runs unchanged. For four SmolLM2-shaped Llama layers,
the first two cut the trace time by 39% and the graph's nodes by 49% (958
to 492).
"""

import types

import torch

_REGISTERED = False


def _copy(function):
    """The same function as another object, which Dynamo does not replace."""
    return types.FunctionType(
        function.__code__,
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )


def resolved_device(name):
    """The device a tensor moved to Keras's device `name` ends up on.

    Keras's torch backend names its device without an index (`"cuda"`),
    and `x.to("cuda")` returns `x` itself when `x` is on the current CUDA
    device; `str(x.device)` is then `"cuda:0"`, which never equals
    `"cuda"`.

    Args:
        name: Keras's device name, e.g. `"cpu"` or `"cuda"`.
    """
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def substitute_keras_helpers():
    """Registers the traced substitutes, once per process."""
    global _REGISTERED
    if _REGISTERED:
        return
    from keras.src.backend.common import dtypes
    from keras.src.backend.common import keras_tensor
    from keras.src.backend.common import variables
    from keras.src.backend.torch import core
    from keras.src.backend.torch import numpy as torch_numpy

    @torch.compiler.substitute_in_graph(keras_tensor.any_symbolic_tensors)
    def any_symbolic_tensors(args=None, kwargs=None):
        return False

    keras_convert_to_tensor = _copy(core.convert_to_tensor)
    # Keras's device is fixed for a serving process.
    device = resolved_device(core.get_device())

    @torch.compiler.substitute_in_graph(core.convert_to_tensor)
    def convert_to_tensor(x, dtype=None, sparse=None, ragged=None):
        value = x.value if isinstance(x, core.Variable) else x
        if (
            isinstance(value, torch.Tensor)
            and not sparse
            and not ragged
            and value.device == device
        ):
            return value if dtype is None else value.to(core.to_torch_dtype(dtype))
        return keras_convert_to_tensor(x, dtype, sparse, ragged)

    keras_power = _copy(torch_numpy.power)

    @torch.compiler.substitute_in_graph(torch_numpy.power)
    def power(x1, x2):
        if isinstance(x2, (int, float)) and not isinstance(x2, bool):
            base = core.convert_to_tensor(x1)
            if base.is_floating_point():
                return torch.pow(base, x2)
        return keras_power(x1, x2)

    # Keras's dtype helpers map dtypes to dtypes through its promotion
    # lattice (cached with `lru_cache`, which Dynamo ignores): the same
    # answers for the same constants, read from the process's Keras config,
    # which serving never changes. Dynamo calls them once per call site
    # instead of tracing their Python.
    keras_standardize_dtype = torch.compiler.assume_constant_result(
        _copy(variables.standardize_dtype)
    )

    @torch.compiler.substitute_in_graph(variables.standardize_dtype)
    def standardize_dtype(dtype):
        return keras_standardize_dtype(dtype)

    keras_result_type = torch.compiler.assume_constant_result(_copy(dtypes.result_type))

    @torch.compiler.substitute_in_graph(dtypes.result_type)
    def result_type(*dtypes):
        return keras_result_type(*dtypes)

    keras_to_torch_dtype = torch.compiler.assume_constant_result(
        _copy(core.to_torch_dtype)
    )

    @torch.compiler.substitute_in_graph(core.to_torch_dtype)
    def to_torch_dtype(dtype):
        return keras_to_torch_dtype(dtype)

    from keras.src.tree import tree_api

    keras_flatten = _copy(tree_api.tree_impl.flatten)

    @torch.compiler.substitute_in_graph(tree_api.tree_impl.flatten)
    def flatten(structure):
        if type(structure) in (list, tuple):
            return [leaf for item in structure for leaf in flatten(item)]
        if structure is None or isinstance(structure, torch.Tensor):
            return [structure]
        return keras_flatten(structure)

    keras_take_along_axis = _copy(torch_numpy.take_along_axis)

    @torch.compiler.substitute_in_graph(torch_numpy.take_along_axis)
    def take_along_axis(x, indices, axis=None):
        if (
            axis is not None
            and isinstance(x, torch.Tensor)
            and isinstance(indices, torch.Tensor)
            and x.ndim == indices.ndim
        ):
            axis = axis % x.ndim
            if all(
                x.shape[d] == indices.shape[d] for d in range(x.ndim) if d != axis
            ):
                indices = indices.long()
                indices = torch.where(indices < 0, indices + x.shape[axis], indices)
                return torch.gather(x, axis, indices)
        return keras_take_along_axis(x, indices, axis)

    _REGISTERED = True
