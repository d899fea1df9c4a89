"""KerasHub MoE blocks on vLLM's fused MoE: KerasHub's own outputs.

Each family's block, with random weights, runs its route into a real vLLM
`FusedMoE` (weights loaded by vLLM's loader and prepacked for the CPU
kernel) and must give what the block's own dense all-experts `call` gives.
"""

import tempfile

import keras
import keras_hub
import pytest
import torch
from keras import ops

from vllm_keras_hub.layers import step
from vllm_keras_hub.layers.moe import moe
from vllm_keras_hub.layers.moe import moe_routes
from vllm_keras_hub.testing.presets import backbone_kwargs
from vllm_keras_hub.testing.presets import randomize_constant_weights
from vllm_keras_hub.testing.presets import TINY_FAMILIES

MOE_FAMILIES = ["gemma4_moe", "gpt_oss", "mixtral", "qwen3_5_moe", "qwen3_moe", "qwen_moe"]
# The kernel sums the chosen experts in another order than KerasHub's
# einsum over all of them.
TOLERANCE = {"float32": 1e-5, "bfloat16": 3e-2}


@pytest.fixture(scope="module")
def vllm_config():
    """A vLLM config and a one-rank process group, as a worker has."""
    from vllm.config import VllmConfig
    from vllm.config import set_current_vllm_config
    from vllm.distributed import cleanup_dist_env_and_memory
    from vllm.distributed import init_distributed_environment
    from vllm.distributed import initialize_model_parallel
    from vllm.distributed import model_parallel_is_initialized

    config = VllmConfig()
    # An in-process engine an earlier test module ran in this process leaves
    # its one-rank groups behind; they are the same groups.
    owned = not model_parallel_is_initialized()
    with set_current_vllm_config(config):
        if owned:
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method=f"file://{tempfile.mktemp()}",
                backend="gloo",
            )
            initialize_model_parallel(1, 1)
        yield config
    if owned:
        cleanup_dist_env_and_memory()


def tiny_backbone(family, dtype):
    _, backbone_name, _ = TINY_FAMILIES[family]
    keras.utils.set_random_seed(0)
    backbone = getattr(keras_hub.models, backbone_name)(
        **backbone_kwargs(family, 300), dtype=dtype
    )
    randomize_constant_weights(backbone, seed=0)
    return backbone


def block_inputs(family, backbone, block, hidden_states):
    """The arguments the decoder hands `block`."""
    if family == "gemma4_moe":
        # The expert bank alone: its decoder block's router routes.
        decoder = next(
            layer
            for layer in backbone.transformer_layers
            if layer.moe_expert_bank is block
        )
        flat = ops.reshape(hidden_states, (-1, ops.shape(hidden_states)[-1]))
        return flat, decoder.moe_router(hidden_states)
    return (hidden_states,)


def first_output(outputs):
    return outputs[0] if isinstance(outputs, tuple) else outputs


_built = 0


def _value(variable):
    return variable.value.detach()


def served_block(vllm_config, block, dtype):
    """A vLLM `FusedMoE` holding `block`'s experts, as the model builds it."""
    from vllm.config import set_current_vllm_config

    global _built
    route = moe_routes.route_of(block)
    with set_current_vllm_config(vllm_config):
        runner = moe.build(
            route.spec(block),
            f"moe_test.{_built}",
            getattr(torch, dtype),
            expert_scale=route.expert_scale(block, _value),
        )
        _built += 1
        moe.load(runner, route.weights(block, _value))
        experts = runner.routed_experts
        experts.quant_method.process_weights_after_loading(experts)
    return runner


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_route_gives_the_blocks_own_output(vllm_config, family, dtype):
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    backbone = tiny_backbone(family, dtype)
    blocks = moe_routes.install(backbone)
    assert len(blocks) == len(backbone.transformer_layers)
    block = blocks[0]
    hidden_states = torch.randn(1, 9, 128).to(getattr(torch, dtype))
    inputs = block_inputs(family, backbone, block, hidden_states)
    with torch.no_grad():
        # The class's own `call`: every expert for every token.
        expected = first_output(type(block).call(block, *inputs))
        runner = served_block(vllm_config, block, dtype)
        setattr(block, moe.EXPERTS, moe.Served(runner, 0))
        routed = step.Routed()
        with set_current_vllm_config(vllm_config), set_forward_context(
            None, vllm_config
        ), step.scope(routed=routed):
            served = first_output(block(*inputs))
    assert routed.moe == [0]
    assert served.shape == expected.shape and served.dtype == expected.dtype
    # The experts contribute (as initialised, Gemma4's would give zeros).
    assert float(expected.abs().max()) > 1e-3
    tolerance = TOLERANCE[dtype] * float(expected.abs().max())
    torch.testing.assert_close(served, expected, rtol=0, atol=tolerance)


def test_a_served_block_refuses_to_run_outside_a_step():
    backbone = tiny_backbone("qwen3_moe", "float32")
    block = moe_routes.install(backbone)[0]
    with pytest.raises(RuntimeError, match="run on vLLM's fused MoE"):
        block(torch.randn(1, 2, 128))


class FancyExperts(keras.layers.Layer):
    """An expert bank no route knows."""

    def call(self, x):
        return x


def test_an_expert_layer_without_a_route_is_refused():
    model = keras.Sequential([keras.Input((4,)), FancyExperts()])
    with pytest.raises(moe_routes.MoERouteError, match="FancyExperts"):
        moe_routes.install(model)


def test_experts_the_kernel_cannot_compute_are_refused():
    backbone = tiny_backbone("gpt_oss", "float32")
    backbone.transformer_layers[0].sparse_moe_block.experts.limit = 10.0
    with pytest.raises(moe_routes.MoERouteError, match="'limit': 10.0"):
        moe_routes.install(backbone)
    backbone = tiny_backbone("qwen3_moe", "float32")
    experts = backbone.transformer_layers[1].mlp.expert_bank
    experts.activation = keras.activations.gelu
    with pytest.raises(moe_routes.MoERouteError, match="gelu"):
        moe_routes.install(backbone)
