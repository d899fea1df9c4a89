"""KerasHub LoRA fine-tunes served at the base model's speed.

A tiny Llama3 preset is fine-tuned a few steps with KerasHub's own
`enable_lora`, so that its adapter changes the prompts' greedy tokens. The
oracle is `generate()` with the adapter loaded by KerasHub's own
`load_lora_weights`: its unmerged LoRA forward.
"""

import os

import keras
import keras_hub
import numpy as np
import pytest
import torch
from vllm.platforms import current_platform

from tests.model_test import CHUNK
from tests.model_test import GREEDY
from tests.model_test import MAX_NEW_TOKENS
from tests.model_test import PROMPTS
from vllm_keras_hub import KerasHubLLM
from vllm_keras_hub.entrypoints.cli_test import ENGINE_STARTED
from vllm_keras_hub.entrypoints.cli_test import run_cli
from vllm_keras_hub.lora import merged as lora
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.lora import fine_tune_lora
from vllm_keras_hub.testing.oracle import keras_hub_greedy
from vllm_keras_hub.testing.presets import build_tiny_preset
from vllm_keras_hub.testing.server import assert_served_greedy
from vllm_keras_hub.testing.server import free_port
from vllm_keras_hub.testing.server import running_server
from vllm_keras_hub.testing.server import serve_command

CHUNKED = dict(
    max_num_batched_tokens=CHUNK, max_num_seqs=len(PROMPTS), enable_chunked_prefill=True
)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """The base preset, its fine-tuned adapter and the fine-tuned preset."""
    base = build_tiny_preset("llama3", str(tmp_path_factory.mktemp("base")))
    adapter, tuned_preset = fine_tune_lora(base, str(tmp_path_factory.mktemp("tuned")))
    return base, adapter, tuned_preset


@pytest.fixture(scope="module")
def expected(tuned):
    """`generate()`'s tokens with the adapter (unmerged), and without it."""
    base, adapter, _ = tuned
    with_adapter = keras_hub_greedy(base, PROMPTS, MAX_NEW_TOKENS, lora_weights=adapter)
    without = keras_hub_greedy(base, PROMPTS, MAX_NEW_TOKENS)
    # The adapter matters: it changes the greedy tokens of 5 of the 6 prompts
    # (the longest continues as the base model does for 12 tokens).
    changed = sum(a[1] != b[1] for a, b in zip(with_adapter, without, strict=True))
    assert changed >= len(PROMPTS) - 1
    return with_adapter


def assert_same_tokens(outputs, expected):
    for output, (prompt_ids, generated_ids) in zip(outputs, expected, strict=True):
        assert output.prompt_token_ids == prompt_ids
        assert list(output.outputs[0].token_ids) == generated_ids


def lora_layers(backbone):
    return [layer for layer in backbone._flatten_layers() if hasattr(layer, "lora_kernel_a")]


def assert_merged_and_packed(model):
    """Every adapter layer is merged, and on vLLM's CPU GEMM where it packs."""
    layers = lora_layers(model.backbone)
    assert len(layers) == 4  # query and value of both transformer layers.
    for layer in layers:
        assert not layer.lora_enabled
        assert hasattr(layer, "_packed_kernel") or not current_platform.is_cpu()


@pytest.mark.parametrize("targets", [None, ["query", "value", "feedforward_gate_dense"]])
def test_merged_kernels_compute_keras_hubs_lora_forward_bit_for_bit(tuned, targets, tmp_path):
    """Float32 logits of the merged layers equal KerasHub's LoRA forward.

    With the default targets (EinsumDense) and with a Dense target too, which
    `load_lora_weights` only finds after `enable_lora` with the same names;
    `load_adapter` finds the layers from the file's positions.
    """
    base, adapter, _ = tuned
    if targets is not None:
        trained = keras_hub.models.Backbone.from_preset(base)
        trained.enable_lora(2, target_layer_names=targets)
        for layer in lora_layers(trained):
            shape = layer.lora_kernel_b.shape
            layer.lora_kernel_b.assign(np.random.default_rng(0).normal(size=shape))
        adapter = str(tmp_path / "custom.lora.h5")
        trained.save_lora_weights(adapter)
    keras_lora = keras_hub.models.Backbone.from_preset(base)
    keras_lora.enable_lora(2, target_layer_names=targets)
    keras_lora.load_lora_weights(adapter)
    merged = keras_hub.models.Backbone.from_preset(base)
    assert lora.load_adapter(merged, adapter) == 2
    assert lora.merge_lora(merged) == len(keras_lora._lora_enabled_layers)
    assert not any(layer.lora_enabled for layer in lora_layers(merged))
    kinds = {type(layer).__name__ for layer in lora_layers(merged)}
    assert kinds == ({"EinsumDense"} if targets is None else {"EinsumDense", "Dense"})
    ids = np.random.default_rng(1).integers(1, merged.vocabulary_size, (3, 20)).astype("int32")
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}
    with torch.no_grad():
        want = keras.ops.convert_to_numpy(keras_lora(inputs))
        got = keras.ops.convert_to_numpy(merged(inputs))
    assert np.array_equal(got, want)


def test_adapter_merged_at_load_serves_keras_hubs_lora_tokens(tuned, expected):
    """`KerasHubLLM(..., lora_weights=)`: mixed batch, chunked prefill."""
    base, adapter, _ = tuned
    with in_process_llm(f"keras_hub:{base}", lora_weights=adapter, **CHUNKED) as llm:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert_merged_and_packed(served_model(llm))
    assert_same_tokens(outputs, expected)


def test_preset_saved_after_lora_fine_tuning_serves_compiled(tuned, expected):
    """`save_to_preset` after fine-tuning: Keras merged LoRA into the kernels.

    Served compiled, its tokens are its own `generate()`'s and the adapter's.
    """
    _, _, tuned_preset = tuned
    assert keras_hub_greedy(tuned_preset, PROMPTS, MAX_NEW_TOKENS) == expected
    with in_process_llm(f"keras_hub:{tuned_preset}", enforce_eager=False, **CHUNKED) as llm:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        model = served_model(llm)
        assert model.compiled or model.was_aot_compile_fn_loaded_from_disk
        assert not lora_layers(model.backbone)
        assert model.cpu_gemm_layers > 0 or not current_platform.is_cpu()
    assert_same_tokens(outputs, expected)


def test_serve_merges_the_adapter_and_answers_the_openai_client(tuned, expected):
    base, adapter, _ = tuned
    port = free_port()
    model = f"keras_hub:{base}"
    command = serve_command(
        model,
        "--lora-weights", adapter,
        "--port", str(port),
        "--max-model-len", "256",
        "--dtype", "float32",
        "--enforce-eager",  # the merged adapter is what is tested, not compiling
    )  # fmt: skip
    with running_server(command, port, model_name=model) as (base_url, _):
        assert_served_greedy(base_url, model, PROMPTS[:3], expected[:3], MAX_NEW_TOKENS)


@pytest.fixture
def bad_adapters(tuned, tmp_path):
    """Adapter files that must be refused, and the cause each names."""
    corrupt = tmp_path / "corrupt.lora.h5"
    corrupt.write_bytes(b"not an HDF5 file")
    misnamed = tmp_path / "adapter.h5"
    misnamed.write_bytes(open(tuned[1], "rb").read())
    return [
        (str(tmp_path / "missing.lora.h5"), "does not exist"),
        (str(misnamed), "does not end in '.lora.h5'"),
        (str(corrupt), "is not a KerasHub LoRA adapter"),
    ]


def test_bad_adapter_files_fail_before_the_engine_starts(tuned, bad_adapters):
    base = tuned[0]
    for path, cause in bad_adapters:
        with pytest.raises(lora.LoraAdapterError, match=cause):
            KerasHubLLM(f"keras_hub:{base}", lora_weights=path)
    path, cause = bad_adapters[2]
    result = run_cli("serve", f"keras_hub:{base}", "--lora-weights", path)
    assert result.returncode == 2
    assert cause in result.stderr
    assert not result.engine_started
    assert ENGINE_STARTED not in result.stderr + result.stdout


def test_an_adapter_of_another_base_model_fails_at_load(tuned, tmp_path):
    """Gemma's adapter on the Llama3 preset: refused with the layer and shapes."""
    gemma = build_tiny_preset("gemma", str(tmp_path / "gemma"))
    backbone = keras_hub.models.Backbone.from_preset(gemma)
    backbone.enable_lora(2)
    adapter = str(tmp_path / "gemma.lora.h5")
    backbone.save_lora_weights(adapter)
    with pytest.raises(Exception, match="was not saved from this base model"):
        with in_process_llm(f"keras_hub:{tuned[0]}", lora_weights=adapter):
            pass


def test_lora_weights_needs_a_keras_hub_preset(tuned):
    with pytest.raises(ValueError, match="merges a KerasHub adapter into a 'keras_hub:<preset>'"):
        KerasHubLLM(os.path.dirname(tuned[1]), lora_weights=tuned[1])
