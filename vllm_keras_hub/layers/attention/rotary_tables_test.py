"""Rotary tables: KerasHub's cos/sin, computed once per position."""

import keras
import pytest
import torch
from keras_hub.src.layers.modeling.rotary_embedding import RotaryEmbedding
from keras_hub.src.models.phi3.phi3_rotary_embedding import Phi3SuScaledRotaryEmbedding

from vllm_keras_hub.compile.direct_calls import use_direct_calls
from vllm_keras_hub.compile.direct_calls_test import serving_step
from vllm_keras_hub.compile.direct_calls_test import tiny_gemma
from vllm_keras_hub.layers.attention.rotary_tables import use_rotary_tables


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "settings",
    [
        dict(max_wavelength=10000),
        dict(max_wavelength=500000, scaling_factor=8.0),
        dict(max_wavelength=10000, rope_type="yarn", scaling_factor=4.0),
    ],
)
def test_rotation_equals_keras_at_served_positions(dtype, settings):
    rotary = RotaryEmbedding(dtype=dtype, **settings)
    keras_rotary = RotaryEmbedding(dtype=dtype, **settings)
    # Serving-shaped: one row per token, (tokens, 1, heads, head size).
    query = torch.randn(6, 1, 4, 32).to(getattr(torch, dtype))
    positions = torch.tensor([0, 5, 1, 63, 2, 17]).reshape(-1, 1)
    assert use_rotary_tables(rotary, max_positions=64) == 1
    with torch.no_grad():
        got = rotary(query, positions=positions)
        want = keras_rotary(query, positions=positions)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # One table, of each frequency once: the two halves are equal.
    ((cos, sin),) = rotary._rotary_tables.values()
    assert cos.shape == sin.shape == (64, 16)


def test_layers_with_the_same_settings_share_one_table():
    backbone = tiny_gemma("float32")
    with torch.no_grad():
        expected = serving_step(backbone, 5)
        use_direct_calls(backbone)
        assert use_rotary_tables(backbone, max_positions=16) == 2
        actual = serving_step(backbone, 5)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    first, second = (
        layer.attention.rope_layer for layer in backbone.transformer_layers
    )
    assert first._rotary_tables is second._rotary_tables
    assert len(first._rotary_tables) == 1


def test_float_positions_and_own_methods_keep_keras():
    rotary = RotaryEmbedding()
    phi3 = Phi3SuScaledRotaryEmbedding(
        inverese_freq_short_factor=[1.0] * 8,
        inverese_freq_long_factor=[2.0] * 8,
        max_sequence_length=64,
        pretraining_sequence_length=32,
    )
    model = keras.Sequential([rotary, phi3])
    assert use_rotary_tables(model, max_positions=64) == 1
    query = torch.randn(1, 3, 2, 16)
    with torch.no_grad():
        rotary(query, positions=torch.tensor([[0.0, 1.5, 2.0]]))
    assert rotary._rotary_tables == {}


def test_compiled_rotation_reads_the_table():
    rotary = RotaryEmbedding(max_wavelength=100000)
    use_rotary_tables(rotary, max_positions=64)
    query = torch.randn(4, 1, 3, 16)
    positions = torch.tensor([[3], [9], [0], [40]])
    with torch.no_grad():
        expected = rotary(query, positions=positions)
        graphs = []

        def backend(graph_module, example_inputs):
            graphs.append(graph_module)
            return graph_module.forward

        torch._dynamo.reset()
        got = torch.compile(rotary.call, backend=backend, fullgraph=True)(
            query, positions=positions
        )
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    targets = {str(node.target) for node in graphs[0].graph.nodes}
    assert not any("cos" in target or "sin" in target for target in targets), targets


def test_one_gather_per_step_for_queries_keys_and_every_layer():
    """Inside a served step, the rows for the step's positions are gathered
    once and shared: KerasHub's own results, and in the compiled graph one
    index per table instead of two a layer."""
    from vllm_keras_hub.layers import step as served_step

    backbone = tiny_gemma("float32")
    rotaries = [layer.attention.rope_layer for layer in backbone.transformer_layers]
    queries = [torch.randn(5, 1, 4, 16) for _ in rotaries]
    keys = [torch.randn(5, 1, 2, 16) for _ in rotaries]
    positions = torch.tensor([[4], [0], [7], [2], [9]])

    def step():
        with served_step.scope(rotary_rows={}):
            return [
                (rotary(q, positions=positions), rotary(k, positions=positions))
                for rotary, q, k in zip(rotaries, queries, keys, strict=True)
            ]

    with torch.no_grad():
        expected = step()
        use_rotary_tables(backbone, max_positions=16)
        got = step()
        graphs = []

        def backend(graph_module, example_inputs):
            graphs.append(graph_module)
            return graph_module.forward

        torch._dynamo.reset()
        compiled = torch.compile(step, backend=backend, fullgraph=True)()
    for ours, keras_own in zip(got + compiled, expected + expected, strict=True):
        for a, b in zip(ours, keras_own, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    gathers = [
        node
        for node in graphs[0].graph.nodes
        if node.op == "call_function" and "getitem" in str(node.target)
        and any(isinstance(a, torch.fx.Node) and a.name.startswith("l_positions") for a in node.args)
    ]
    # The cos and the sin table, each indexed once for 2 layers x (q, k).
    assert len(gathers) == 2, [str(g) for g in gathers]
