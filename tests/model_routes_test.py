"""The route guard: every transformer layer hands attention to vLLM once."""

import dataclasses
import types

import keras_hub
import pytest
import torch
from vllm import SamplingParams

from vllm_keras_hub import families
from vllm_keras_hub.layers.moe import moe
from vllm_keras_hub.models.probe import RouteError
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.presets import build_tiny_preset
from vllm_keras_hub.testing.tokenizers import make_tokenizer


def test_layer_that_stops_routing_fails_the_step(tmp_path):
    preset = build_tiny_preset("llama", str(tmp_path))
    with in_process_llm(f"keras_hub:{preset}") as llm:
        model = served_model(llm)
        assert len(model.attention) == 2
        # Layer 1 now answers without handing anything to vLLM.
        attention_layer = model._route_layers[1]
        attention_layer._compute_vllm_attention = (
            lambda hidden_states, cache, context: torch.zeros_like(hidden_states)
        )
        with pytest.raises(RouteError, match="1 of 2 transformer layers handed"):
            llm.generate("Hello", SamplingParams(max_tokens=2), use_tqdm=False)


def test_moe_block_that_stops_routing_fails_the_step(tmp_path):
    preset = build_tiny_preset("qwen3_moe", str(tmp_path))
    with in_process_llm(f"keras_hub:{preset}") as llm:
        model = served_model(llm)
        assert len(model.moe) == 2
        # Block 0 now answers without handing its experts to vLLM.
        block = model.moe_blocks[0]
        block.call = lambda hidden_states, *args, **kwargs: (hidden_states, None)
        with pytest.raises(RouteError, match="1 expert calls to vLLM in this step for 2 MoE blocks"):
            llm.generate("Hello", SamplingParams(max_tokens=2), use_tqdm=False)


def test_moe_block_that_routes_as_another_fails_the_step(tmp_path):
    preset = build_tiny_preset("qwen3_moe", str(tmp_path))
    with in_process_llm(f"keras_hub:{preset}") as llm:
        model = served_model(llm)
        # Block 1 hands its tokens to block 0's experts: two calls for two
        # blocks, which a count alone would pass.
        first, second = model.moe_blocks
        setattr(second, moe.EXPERTS, getattr(first, moe.EXPERTS))
        with pytest.raises(RouteError, match="2 expert calls to vLLM in this step for 2 MoE blocks"):
            llm.generate("Hello", SamplingParams(max_tokens=2), use_tqdm=False)


def test_moe_blocks_must_each_route_once_at_start_up():
    from vllm_keras_hub.models.probe import check_moe_routes
    from vllm_keras_hub.models.probe import Probe

    first, second = (types.SimpleNamespace(name=f"block_{i}") for i in range(2))
    check_moe_routes(Probe([], [], [first, second]), [first, second], "m")
    for calls in ([first], [first, first, second], [first, second, object()]):
        with pytest.raises(RouteError, match="exactly once"):
            check_moe_routes(Probe([], [], calls), [first, second], "m")


def test_family_without_route_fails_at_start_up(tmp_path, monkeypatch):
    tokenizer = make_tokenizer("mistral")
    backbone = keras_hub.models.MixtralBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=128,
        intermediate_dim=256,
        num_experts=2,
    )
    preprocessor = keras_hub.models.MixtralCausalLMPreprocessor(tokenizer=tokenizer)
    keras_hub.models.MixtralCausalLM(backbone, preprocessor).save_to_preset(
        str(tmp_path)
    )
    # Pretend keras-hub routed Mixtral: its real KerasHub attention layers
    # have no vLLM route of their own, so the start-up probe must refuse them.
    mixtral = dataclasses.replace(
        families._BY_BACKBONE["MixtralBackbone"], route="keras_hub"
    )
    monkeypatch.setitem(families._BY_BACKBONE, "MixtralBackbone", mixtral)
    monkeypatch.setitem(families._BY_NAME, "mixtral", mixtral)
    with pytest.raises(
        RouteError, match="did not route: transformer_layer_0, transformer_layer_1"
    ):
        with in_process_llm(f"keras_hub:{tmp_path}"):
            pass


def _spec(num_kv_heads=2, head_size=32, kv_sharing_target=None):
    from vllm_keras_hub.models.probe import AttentionSpec

    return AttentionSpec(
        num_heads=4,
        head_size=head_size,
        num_kv_heads=num_kv_heads,
        scale=1.0,
        sliding_window=None,
        soft_cap=None,
        kv_sharing_target=kv_sharing_target,
    )


@pytest.mark.parametrize(
    "specs, message",
    [
        ([_spec(), _spec(kv_sharing_target=1)], "not an earlier layer"),
        (
            [_spec(), _spec(kv_sharing_target=0), _spec(kv_sharing_target=1)],
            "not an earlier layer with a cache of its own",
        ),
        ([_spec(), _spec(head_size=64, kv_sharing_target=0)], "2 heads of 64"),
    ],
)
def test_kv_sharing_layer_must_fit_its_targets_cache(specs, message):
    from vllm_keras_hub.models.probe import check_kv_sharing

    with pytest.raises(RouteError, match=message):
        check_kv_sharing(specs)
    check_kv_sharing([_spec(), _spec(), _spec(kv_sharing_target=0)])


def test_a_pipeline_stage_holds_each_kv_sharing_layers_target():
    """A stage's specs are named by their backbone indices: layer 5 may
    read layer 2 where the stage holds both, not where 2 is another's."""
    from vllm_keras_hub.models.probe import check_kv_sharing

    specs = [_spec(), _spec(), _spec(kv_sharing_target=2)]
    check_kv_sharing([_spec(), *specs], [2, 3, 4, 5])
    with pytest.raises(RouteError, match="Layer 5 shares the K/V of layer 2"):
        check_kv_sharing(specs, [3, 4, 5])


def test_a_head_size_the_attention_kernel_cannot_run_is_refused_at_start_up(tmp_path):
    from vllm.platforms import current_platform

    tokenizer = make_tokenizer("llama3")
    # 64 wide, 4 heads: heads of 16, which vLLM's CPU attention cannot run.
    backbone = keras_hub.models.Llama3Backbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=1,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
    )
    preprocessor = keras_hub.models.Llama3CausalLMPreprocessor(tokenizer=tokenizer)
    keras_hub.models.Llama3CausalLM(backbone, preprocessor).save_to_preset(str(tmp_path))
    if not current_platform.is_cpu():
        # GPU attention kernels run heads of 16: the model serves.
        with in_process_llm(f"keras_hub:{tmp_path}") as llm:
            assert llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False)
        return
    with pytest.raises(ValueError) as error:
        with in_process_llm(f"keras_hub:{tmp_path}"):
            pass
    message = str(error.value)
    assert "attention heads of size 16" in message
    assert "CPU_ATTN" in message and "[32, 64, 80, 96" in message
