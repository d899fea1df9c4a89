"""Hybrid presets: Gated DeltaNet layers with their state in vLLM's state cache.

Float32 parity (batched, chunked beside decodes, compiled) is in
`model_test.py`, as for every family. Here: KerasHub's `generate()` bug that
makes the full forward the oracle, bfloat16 on vLLM's CPU GDN kernels, a
prompt prefilled in chunks that cut KerasHub's 64-token delta-rule chunks,
a prefix-cache hit that restores a state vLLM saved, and the engine
settings refused at start-up.
"""

import numpy as np
import pytest
from vllm import SamplingParams

from vllm_keras_hub.hybrid_settings import UnsupportedHybridConfigError
from vllm_keras_hub.testing import support_matrix
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.oracle import keras_hub_greedy
from vllm_keras_hub.testing.oracle import keras_hub_greedy_full_forward

PROMPTS = ["a", "Hello there", "The quick brown fox jumps over the lazy dog."]
# 408 tokens: several of KerasHub's 64-token delta-rule chunks, and more
# than one block of the prefix cache (256 tokens for this preset).
LONG_PROMPT = " ".join(f"word{i} and then" for i in range(60))
MAX_NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def preset(shared):
    return shared.preset("qwen3_5")


def assert_tokens(outputs, expected):
    for output, (prompt_ids, generated) in zip(outputs, expected, strict=True):
        assert output.prompt_token_ids == prompt_ids
        assert list(output.outputs[0].token_ids) == generated


def test_generate_is_not_the_forward(preset):
    """KerasHub bug: `Qwen3_5CausalLM.generate()` is not the model's forward.

    Its prefill runs the recurrent state over the right-padded batch, then
    feeds the last prompt token again, so a padded prompt decodes tokens
    the full-sequence forward does not give. Served tokens follow the
    forward (`model_test.py`).
    """
    # The first tokens already differ; the full forward costs a whole
    # recurrence per token, so this takes 3.
    generated = keras_hub_greedy(preset, PROMPTS, 3)
    forward = keras_hub_greedy_full_forward(preset, PROMPTS, 3)
    assert [ids for ids, _ in generated] == [ids for ids, _ in forward]
    assert [tokens for _, tokens in generated] != [tokens for _, tokens in forward]


def test_chunks_cut_the_delta_rule_chunks_and_a_prefix_hit_restores_the_state(preset):
    """A long prompt prefilled 48 tokens a step, then served again from cache.

    The second request finds the first's blocks in the prefix cache (vLLM's
    "align" mode saves each block's state) and computes only the rest.
    """
    expected = keras_hub_greedy_full_forward(preset, [LONG_PROMPT], MAX_NEW_TOKENS)
    assert len(expected[0][0]) > 2 * 64
    with in_process_llm(
        f"keras_hub:{preset}",
        max_model_len=1024,
        max_num_batched_tokens=48,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
    ) as llm:
        cache_config = llm.llm_engine.vllm_config.cache_config
        assert cache_config.mamba_cache_mode == "align"
        first = llm.generate([LONG_PROMPT], GREEDY, use_tqdm=False)
        second = llm.generate([LONG_PROMPT], GREEDY, use_tqdm=False)
    support_matrix.record("qwen3_5", "Qwen3_5Backbone", prefix_cache="FAIL")
    assert_tokens(first, expected)
    assert_tokens(second, expected)
    assert first[0].num_cached_tokens == 0
    # Hybrid models cache whole blocks, as large as one state page.
    assert second[0].num_cached_tokens >= cache_config.block_size > 0
    support_matrix.record("qwen3_5", "Qwen3_5Backbone", prefix_cache="pass")


def prompt_logprobs(output):
    return np.array([next(iter(d.values())).logprob for d in output.prompt_logprobs[1:]])


def forward_logprobs(preset, prompt_ids, dtype):
    import keras
    import torch

    from vllm_keras_hub.export.sampling import causal_lm_class

    causal_lm = causal_lm_class(preset).from_preset(preset, dtype=dtype, preprocessor=None)
    token_ids = np.array([prompt_ids], "int32")
    with torch.inference_mode():
        logits = causal_lm(
            {"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)},
            training=False,
        )
    logits = torch.as_tensor(keras.ops.convert_to_numpy(keras.ops.cast(logits, "float32")))
    logprobs = torch.log_softmax(logits[0], dim=-1).numpy()
    return np.array([logprobs[i - 1, prompt_ids[i]] for i in range(1, len(prompt_ids))])


def test_bfloat16_on_vllm_kernels_is_as_close_as_keras_hubs_own(preset):
    """In bfloat16 vLLM's CPU GDN kernels run the recurrence.

    Greedy tokens cannot be compared: bfloat16 keeps 8 bits of mantissa, and
    the preset's own bfloat16 forward already departs from its float32 one
    by tenths of a logprob on these prompts, enough to flip near ties. The
    tolerance: each prompt token's served logprob is within three times
    that departure of the float32 forward's. (Measured: 0.375 against
    0.187, 2.0x, with the tiny preset's decays drawn over the reference
    range.)
    """
    prompts = [PROMPTS[2], LONG_PROMPT]
    with in_process_llm(f"keras_hub:{preset}", dtype="bfloat16", max_model_len=512) as llm:
        assert all(state.vllm_kernels for state in served_model(llm).states)
        outputs = llm.generate(
            prompts,
            SamplingParams(max_tokens=1, prompt_logprobs=0),
            use_tqdm=False,
        )
    for output in outputs:
        ids = output.prompt_token_ids
        reference = forward_logprobs(preset, ids, "float32")
        keras_bfloat16 = np.abs(forward_logprobs(preset, ids, "bfloat16") - reference).max()
        served = np.abs(prompt_logprobs(output) - reference).max()
        assert 0 < keras_bfloat16 < 1.0
        assert served <= 3 * keras_bfloat16, (served, keras_bfloat16)


@pytest.mark.parametrize(
    "settings, cause",
    [
        (
            dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                     "prompt_lookup_max": 2}),
            "Speculative decoding",
        ),
        (dict(mamba_ssm_cache_dtype="bfloat16"), "mamba_ssm_cache_dtype='bfloat16'"),
        (dict(enable_lora=True), "LoRA adapters per request"),
    ],
)
def test_settings_the_state_cannot_serve_are_refused(preset, settings, cause):
    with pytest.raises(UnsupportedHybridConfigError, match=cause):
        with in_process_llm(f"keras_hub:{preset}", **settings):
            pass
