"""Dynamo's substitutes for Keras helpers: Keras's results, a smaller graph."""

import collections

import keras
import pytest
import torch
from keras import ops

from vllm_keras_hub.compile.direct_calls import use_direct_calls
from vllm_keras_hub.compile.direct_calls_test import serving_step
from vllm_keras_hub.compile.direct_calls_test import tiny_gemma
from vllm_keras_hub.compile.dynamo_substitutes import resolved_device
from vllm_keras_hub.compile.dynamo_substitutes import substitute_keras_helpers


def traced_ops(function, *args):
    """`function(*args)` compiled; returns its result and its graph's op counts.

    A `.to(device)` counts as "to device", a `.to(dtype)` as "to".
    """
    counts = collections.Counter()

    def backend(graph_module, example_inputs):
        for node in graph_module.graph.nodes:
            if node.op in ("placeholder", "output"):
                continue
            name = str(node.target)
            if name == "to" and isinstance(node.args[-1], (str, torch.device)):
                name = "to device"
            counts[name] += 1
        return graph_module.forward

    torch._dynamo.reset()
    result = torch.compile(function, backend=backend, fullgraph=True)(*args)
    return result, counts


def keras_ops_step(x, y):
    # Tensors, a Python scalar and a dtype cast.
    return ops.cast(ops.add(ops.multiply(x, 2.0), y), "float64")


@pytest.fixture(scope="module", autouse=True)
def substitutes():
    substitute_keras_helpers()


def test_results_equal_keras_and_no_device_moves_are_traced():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    result, counts = traced_ops(keras_ops_step, x, y)
    torch.testing.assert_close(result, keras_ops_step(x, y), rtol=0, atol=0)
    assert result.dtype == torch.float64
    # Keras's own convert_to_tensor would add an `x.to("cpu")` per tensor
    # argument.
    assert counts["to device"] == 0, counts
    assert counts["to"] == 1, counts  # the float64 cast


def test_dtype_promotion_under_dynamo_is_keras_own():
    """Keras's dtype helpers run once per call site at trace time (their
    results are constants of the process's Keras config): the promotions
    are Keras's, not torch's (int + float scalar gives float32, mean of ints
    float32, bfloat16 + float32 float32)."""

    def step(ints, half, full):
        return (
            ops.add(ints, 1.5),
            ops.mean(ints, axis=-1),
            ops.add(half, full),
            ops.cast(ops.multiply(half, 2), "float16"),
            ops.convert_to_tensor([1, 2]),
        )

    ints = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    half, full = torch.randn(3, 4).bfloat16(), torch.randn(3, 4)
    expected = step(ints, half, full)
    got, _ = traced_ops(step, ints, half, full)
    assert [t.dtype for t in expected] == [
        torch.float32, torch.float32, torch.float32, torch.float16, torch.int32
    ]
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_variables_and_scalars_still_go_through_keras():
    variable = keras.Variable(torch.ones(2, 2), dtype="float32")

    def step(x):
        return ops.add(ops.convert_to_tensor(variable), ops.convert_to_tensor(3))

    result, _ = traced_ops(step, torch.zeros(2, 2))
    assert torch.equal(result, torch.full((2, 2), 4.0))


def test_symbolic_tensors_are_still_found_outside_dynamo():
    inputs = keras.Input((4,))
    outputs = ops.add(inputs, 1.0)
    assert isinstance(outputs, keras.KerasTensor)


def test_backbone_step_is_equal_and_traces_no_device_moves():
    backbone = tiny_gemma("float32")
    use_direct_calls(backbone)
    with torch.no_grad():
        expected = serving_step(backbone, 5)
        result, counts = traced_ops(serving_step, backbone, 5)
    torch.testing.assert_close(result, expected)
    assert counts["to device"] == 0, counts


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_python_exponent_stays_a_scalar(dtype):
    # Keras makes the 2 a tensor; Inductor then computes a general `pow`
    # instead of `x * x`.
    def rms(x):
        return ops.mean(ops.power(x, 2), axis=-1), ops.power(x, 0.5), ops.power(x, x)

    x = torch.rand(3, 8).to(getattr(torch, dtype))
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    result = torch.compile(rms, backend=backend, fullgraph=True)(x)
    for got, want in zip(result, rms(x), strict=True):
        # torch.pow(x, 0.5) is a square root: the last bit may differ.
        torch.testing.assert_close(got, want)
    exponents = [
        node.args[1]
        for node in graphs[0].graph.nodes
        if node.op == "call_function" and node.target is torch.pow
    ]
    assert exponents[:2] == [2, 0.5], exponents
    assert isinstance(exponents[2], torch.fx.Node)


def test_take_along_axis_keeps_the_token_count_dynamic():
    # Gemma4's MoE router gathers each token's top-k probabilities this way.
    def top_k_probs(probs):
        _, indices = ops.top_k(probs, k=2)
        return ops.take_along_axis(probs, indices, axis=-1), ops.take_along_axis(
            probs, indices - 4, axis=1
        )

    probs = torch.softmax(torch.randn(6, 4), -1)
    torch._dynamo.reset()
    torch._dynamo.mark_dynamic(probs, 0)
    compiled = torch.compile(top_k_probs, backend="eager", fullgraph=True)
    for got, want in zip(compiled(probs), top_k_probs(probs), strict=True):
        assert torch.equal(got, want)
    # Another token count runs the same graph: nothing specialized it.
    other = torch.softmax(torch.randn(9, 4), -1)
    with torch.compiler.set_stance("fail_on_recompile"):
        for got, want in zip(compiled(other), top_k_probs(other), strict=True):
            assert torch.equal(got, want)
    # A broadcast still goes through Keras.
    row = torch.tensor([[0.1, 0.2, 0.7]])
    assert ops.take_along_axis(row, torch.tensor([[2], [0]]), axis=1).shape == (2, 1)


def test_keras_device_names_resolve_as_tensors_report_them(monkeypatch):
    # On a GPU, Keras says "cuda" and a tensor on it says "cuda:0": the
    # substitute must see them as the same device (no CUDA needed here).
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolved_device("cuda") == torch.device("cuda:1")
    assert resolved_device("cuda:0") == torch.device("cuda:0")
    assert resolved_device("cpu") == torch.zeros(1).device


def test_registering_is_process_wide_and_leaves_eager_keras_alone():
    """The substitutes stay registered for the process (README), so in a
    fresh one: Keras's helpers are the same objects after, and eager Keras
    gives bit-identical results; only Dynamo's traces change."""
    import subprocess
    import sys
    import textwrap

    from vllm_keras_hub.testing.user_env import user_env

    code = """
        import torch
        from keras import ops
        from keras.src.backend.common import keras_tensor
        from keras.src.backend.torch import core, numpy as torch_numpy

        from vllm_keras_hub.compile.dynamo_substitutes import substitute_keras_helpers

        from keras.src.backend.common import dtypes, variables
        helpers = (keras_tensor.any_symbolic_tensors, core.convert_to_tensor,
                   torch_numpy.power, torch_numpy.take_along_axis,
                   variables.standardize_dtype, dtypes.result_type, core.to_torch_dtype)
        x = torch.randn(3, 4)
        index = torch.tensor([[0], [2], [1]])
        def step():
            return (ops.power(ops.add(ops.multiply(x, 2.0), 1), 2),
                    ops.take_along_axis(x, index, axis=1))
        before = step()
        substitute_keras_helpers()
        after = step()
        assert helpers == (keras_tensor.any_symbolic_tensors, core.convert_to_tensor,
                           torch_numpy.power, torch_numpy.take_along_axis,
                           variables.standardize_dtype, dtypes.result_type,
                           core.to_torch_dtype)
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        print("eager unchanged")
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=user_env(KERAS_BACKEND="torch"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "eager unchanged" in result.stdout
