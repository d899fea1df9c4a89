"""`KerasHubLLM` end to end with vLLM's default process layout.

The engine core and its worker are spawned processes that know our model class,
config type and load format only through the `vllm.general_plugins` entry
point, so this also proves the plugin registers in every process.
"""

import gc
import os

import keras_hub
import pytest
from vllm import SamplingParams

from vllm_keras_hub import KerasHubLLM
from vllm_keras_hub.export.model_folder import ModelFolder
from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.oracle import keras_hub_greedy
from vllm_keras_hub.testing.presets import build_tiny_preset

PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def gemma_preset(tmp_path_factory):
    # Flat logits, so that sampling visibly differs from greedy.
    path = str(tmp_path_factory.mktemp("gemma"))
    return build_tiny_preset("gemma", path, logit_scale=1.0)


@pytest.fixture(scope="module")
def gemma_llm(gemma_preset):
    llm = KerasHubLLM(f"keras_hub:{gemma_preset}", **TEST_ENGINE_KWARGS)
    yield llm
    llm.close()


def test_default_sampling_is_the_presets_greedy_sampler(gemma_llm, gemma_preset):
    defaults = gemma_llm.get_default_sampling_params()
    assert defaults.temperature == 0.0
    assert defaults.max_tokens == 16  # vLLM's default length.
    outputs = gemma_llm.generate(PROMPTS, use_tqdm=False)
    expected = keras_hub_greedy(gemma_preset, PROMPTS, 16)
    end_token_id = keras_hub.tokenizers.Tokenizer.from_preset(gemma_preset).end_token_id
    for output, (prompt_ids, generated_ids) in zip(
        outputs, expected, strict=True
    ):
        assert output.prompt_token_ids == prompt_ids
        tokens = list(output.outputs[0].token_ids)
        assert tokens == generated_ids[: len(tokens)]
        assert len(tokens) == 16 or tokens[-1] == end_token_id


def test_explicit_sampling_params_override_the_defaults(gemma_llm):
    def sample(seed):
        params = SamplingParams(temperature=2.0, seed=seed, max_tokens=8, ignore_eos=True)
        return tuple(gemma_llm.generate(PROMPTS[0], params, use_tqdm=False)[0].outputs[0].token_ids)

    samples = [sample(seed) for seed in range(8)]
    assert all(len(tokens) == 8 for tokens in samples)
    assert len(set(samples)) > 1  # Sampled, not the preset's greedy default.
    assert sample(3) == samples[3]


def test_model_folder_is_removed_on_close_and_on_garbage_collection(gemma_preset):
    # Settings no other engine of this module uses: a folder is shared by
    # every live engine of the same preset and settings.
    with in_process_llm(f"keras_hub:{gemma_preset}", max_model_len=96) as llm:
        folder = llm.model_folder.path
        assert os.path.isfile(os.path.join(folder, "config.json"))
    assert not os.path.exists(folder)

    folder = ModelFolder(gemma_preset, max_model_len=97)
    path = folder.path
    del folder
    gc.collect()
    assert not os.path.exists(path)


def test_the_cpu_default_kv_cache_is_2_gib(gemma_preset):
    """README: with no memory setting, a CPU engine gets a 2 GiB KV cache."""
    from vllm.platforms import current_platform

    from vllm_keras_hub.settings import CPU_KV_CACHE_BYTES
    from vllm_keras_hub.testing.engines import in_process_engine_env

    assert CPU_KV_CACHE_BYTES == 2 << 30
    with in_process_engine_env():
        llm = KerasHubLLM(
            f"keras_hub:{gemma_preset}",
            max_model_len=98,
            dtype="float32",
            enforce_eager=True,
            distributed_executor_backend="uni",
        )
        try:
            engine = llm.llm_engine
            asked = engine.vllm_config.cache_config.kv_cache_memory_bytes
            runner = engine.engine_core.engine_core.model_executor.driver_worker
            tensors = runner.worker.model_runner.kv_cache_config.kv_cache_tensors
            allocated = sum(tensor.size for tensor in tensors)
        finally:
            llm.close()
    if not current_platform.is_cpu():
        assert asked is None  # vLLM's own gpu_memory_utilization decides.
        return
    assert asked == 2 << 30
    assert 0.9 * asked <= allocated <= asked


def test_unsupported_settings_are_refused_before_an_engine_starts(
    gemma_preset, tmp_path
):
    from vllm_keras_hub.lora.adapters import UnsupportedLoraError
    from vllm_keras_hub.parallel_settings import UnsupportedParallelismError

    # Its 4 layers are one KV-sharing group: no second stage is left.
    gemma4 = build_tiny_preset("gemma4", str(tmp_path))
    with pytest.raises(UnsupportedParallelismError, match="must be in one stage"):
        KerasHubLLM(f"keras_hub:{gemma4}", pipeline_parallel_size=2)
    # A filter of vLLM's module names could wrap an MoE family's experts.
    with pytest.raises(UnsupportedLoraError, match="--lora-target-modules .*Serve without"):
        KerasHubLLM(
            f"keras_hub:{gemma_preset}", enable_lora=True, lora_target_modules=["experts"]
        )


TOP_K_SAMPLES = 8


def test_default_sampling_is_the_presets_top_k_sampler(tmp_path):
    """README: most families sample top-k 5 by default, as `compile()` does.

    Flat logits, so plain sampling would often leave the top 5. Every sampled
    token is checked against the preset's own logits on its served context.
    """
    import keras
    import numpy as np

    preset = build_tiny_preset("llama3", str(tmp_path), logit_scale=1.0)
    with in_process_llm(f"keras_hub:{preset}") as llm:
        defaults = llm.get_default_sampling_params()
        assert (defaults.top_k, defaults.temperature) == (5, 1.0)
        outputs = llm.generate(PROMPTS * TOP_K_SAMPLES, use_tqdm=False)
    causal_lm = keras_hub.models.CausalLM.from_preset(preset, preprocessor=None)
    ranks = []
    for output in outputs:
        prompt, tokens = output.prompt_token_ids, list(output.outputs[0].token_ids)
        context = np.array([prompt + tokens])
        logits = causal_lm({"token_ids": context, "padding_mask": np.ones_like(context)})
        logits = keras.ops.convert_to_numpy(logits[0])
        for step, token in enumerate(tokens):
            scores = logits[len(prompt) - 1 + step]
            ranks.append(int((scores > scores[token]).sum()))
    assert max(ranks) < 5, ranks
    assert len(set(ranks)) > 1, ranks  # Sampled, not greedy.


def test_dtype_auto_serves_a_bfloat16_preset_in_bfloat16(tmp_path):
    """`serve`'s default `--dtype auto`, for a preset saved in bfloat16."""
    import torch

    from vllm_keras_hub.testing.engines import served_model

    plain = build_tiny_preset("llama3", str(tmp_path / "float32"))
    preset = str(tmp_path / "bfloat16")
    keras_hub.models.CausalLM.from_preset(plain, dtype="bfloat16").save_to_preset(preset)
    with in_process_llm(f"keras_hub:{preset}", dtype="auto") as llm:
        assert llm.llm_engine.model_config.dtype == torch.bfloat16
        assert {v.dtype for v in served_model(llm).backbone.weights} == {"bfloat16"}
