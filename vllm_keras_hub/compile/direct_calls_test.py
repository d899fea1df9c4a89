"""Direct calls: the same outputs as Keras's `__call__`, and traceable."""

import keras
import keras_hub
import pytest
import torch
from keras_hub.src.vllm.context import vllm_context_scope

from vllm_keras_hub.compile.direct_calls import use_direct_calls


def tiny_gemma(dtype):
    keras.utils.set_random_seed(0)
    return keras_hub.models.GemmaBackbone(
        vocabulary_size=256,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        head_dim=32,
        dtype=dtype,
    )


def serving_step(backbone, num_tokens):
    """One serving-shaped step, with attention answered by a stand-in."""

    def paged_attention(cache, query, key, value, *args, **kwargs):
        return cache, query * value.mean() + key.mean()

    token_ids = torch.arange(num_tokens).reshape(-1, 1)
    with vllm_context_scope(
        paged_attention_func=paged_attention,
        positions=torch.arange(num_tokens),
        kv_caches=[None] * len(backbone.transformer_layers),
    ):
        return backbone(
            {"token_ids": token_ids, "padding_mask": torch.ones_like(token_ids)},
            training=False,
        )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_outputs_equal_keras_calls(dtype):
    backbone = tiny_gemma(dtype)
    with torch.no_grad():
        expected = serving_step(backbone, 7)
        assert use_direct_calls(backbone) > 10
        actual = serving_step(backbone, 7)
    assert actual.dtype == expected.dtype == getattr(torch, dtype)
    assert torch.equal(actual, expected)


def test_only_the_given_model_changes():
    served, other = tiny_gemma("float32"), tiny_gemma("float32")
    use_direct_calls(served)
    served_dense = served.transformer_layers[0].attention.query_dense
    other_dense = other.transformer_layers[0].attention.query_dense
    assert type(served_dense).__call__ is not type(other_dense).__call__
    assert isinstance(served_dense, type(other_dense))
    assert type(other_dense).__call__ is keras.layers.Layer.__call__


def test_unbuilt_layer_is_built_by_its_first_call():
    layer = keras.layers.Dense(3)
    use_direct_calls(layer)
    output = layer(torch.ones(2, 4))
    assert layer.built and tuple(output.shape) == (2, 3)


def test_floating_inputs_are_cast_to_the_compute_dtype():
    layer = keras.layers.Dense(3, dtype="bfloat16")
    layer.build((None, 4))
    use_direct_calls(layer)
    assert layer(torch.ones(2, 4, dtype=torch.float32)).dtype == torch.bfloat16


def test_serving_step_traces_as_one_graph():
    # vLLM compiles the forward with fullgraph=True: a single graph break
    # would stop the engine from starting.
    backbone = tiny_gemma("float32")
    use_direct_calls(backbone)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(serving_step)(backbone, 5)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
