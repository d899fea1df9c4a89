"""Greedy parity: served tokens equal the preset's own `CausalLM.generate()`.

Every routed family, as a tiny random-weight preset saved with
`save_to_preset` and served through `keras_hub:<folder>` by the real vLLM
engine, scheduler, paged KV cache and CPU attention kernel, in vLLM's
default compiled mode, with chunked prefill and prefix caching: one engine
per family proves its whole row of the support matrix.
"""

import pytest
from vllm import SamplingParams
from vllm.compilation.counter import compilation_counter
from vllm.platforms import current_platform

from vllm_keras_hub.testing import support_matrix
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.presets import MULTIMODAL
from vllm_keras_hub.testing.presets import TINY_FAMILIES
from vllm_keras_hub.testing.presets import WINDOW

# Lengths from 1 to ~70 tokens: several prompts pass every test preset's
# sliding window (WINDOW tokens), and with CHUNK tokens per step the long ones
# are prefilled in chunks while the short ones already decode.
PROMPTS = [
    "a",
    "Hello there",
    "The quick brown fox jumps over the lazy dog.",
    "Numbers 1234567890 and punctuation; don't stop!",
    "KerasHub models served by vLLM use a paged KV cache, continuous "
    "batching and chunked prefill.",
    "One two three four five six seven eight nine ten eleven twelve "
    "thirteen fourteen fifteen sixteen seventeen",
]
MAX_NEW_TOKENS = 12
CHUNK = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)

# KerasHub bug: `GPTNeoXAttention`'s cached decode (what `generate()` runs)
# rotates each decoded query at position 0, so the tokens it decodes are not
# the model's. Serving rotates at the true positions; its oracle is the
# full-sequence forward (see `test_gpt_neox_generate_is_not_its_forward`).
# KerasHub bug: `Qwen3_5CausalLM.generate()` runs its recurrent state over
# the batch's padding and feeds the last prompt token twice (see
# `hybrid_test.py`); its oracle is the full-sequence forward too.
FULL_FORWARD_ORACLE = ("gpt_neox", "qwen3_5", "qwen3_5_moe")


def expected_tokens(shared, family, multimodal=False):
    """The oracle's prompt and generated ids for `family`'s tiny preset."""
    preset = shared.preset(family, multimodal=multimodal)
    full_forward = family in FULL_FORWARD_ORACLE
    return shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS, full_forward=full_forward)


def assert_same_tokens(outputs, expected, family, column, row=None):
    """Asserts token equality, recording the outcome in the support matrix.

    Args:
        row: The matrix row's test-preset name; `family` by default.
    """
    backbone = TINY_FAMILIES[family][1]
    row = row or family
    support_matrix.record(row, backbone, **{column: "FAIL"})
    assert len(outputs) == len(expected)
    for prompt, output, (prompt_ids, generated_ids) in zip(
        PROMPTS, outputs, expected, strict=True
    ):
        assert output.prompt_token_ids == prompt_ids, (family, prompt)
        assert list(output.outputs[0].token_ids) == generated_ids, (family, prompt)
    support_matrix.record(row, backbone, **{column: "pass"})


def record_features(family, model):
    """Records the attention features the served model actually used."""
    specs = model.attention_specs
    support_matrix.record(
        family,
        TINY_FAMILIES[family][1],
        window=any(spec.sliding_window for spec in specs),
        soft_cap=any(spec.soft_cap for spec in specs),
        sinks=any(getattr(spec, "sinks", None) is not None for spec in specs),
        moe=len(model.moe) > 0,
    )


# Every layer of these tiny presets has an MoE block.
MOE_FAMILIES = (
    "gemma4_moe", "gpt_oss", "mixtral", "qwen3_5_moe", "qwen3_moe", "qwen_moe"
)


def assert_experts_on_vllm(family, model):
    """Each MoE block's experts are a vLLM `FusedMoE`; Keras's copy is gone."""
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    from vllm_keras_hub.layers.moe import moe_routes

    layers = len(model.attention) + len(model.states)
    expected = layers if family in MOE_FAMILIES else 0
    assert len(model.moe) == len(model.moe_blocks) == expected
    for block, runner in zip(model.moe_blocks, model.moe, strict=True):
        assert isinstance(runner, MoERunner)
        for variable in moe_routes.route_of(block).variables(block):
            assert variable.value.numel() == 0, (block.name, variable.path)


# One engine proves every column of a family's row, in the mode users run:
# vLLM's default compiled mode, prefix caching on (blocks of 32 tokens, the
# smallest vLLM's CPU attention takes, so the longer test prompts fill
# some), and 32 tokens a step, so short prompts prefill whole in one step
# while the long ones prefill in chunks beside decodes.
STEP = 32
ENGINE = dict(
    enforce_eager=False,
    max_num_batched_tokens=STEP,
    max_num_seqs=len(PROMPTS),
    enable_chunked_prefill=True,
    enable_prefix_caching=True,
)
BLOCK = 32
# Their state pages set their own block size (`hybrid_test.py` hits the
# prefix cache with a prompt longer than one).
HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_moe")


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_greedy_parity(family, shared):
    """All prompts in one batch, compiled, chunked beside decodes, then
    again from the prefix cache: every row the oracle's tokens.

    torch.compile (Inductor) traces the forward once with a dynamic token
    count; the one graph then runs steps of many sizes.
    """
    expected = expected_tokens(shared, family)
    assert max(len(ids) for ids, _ in expected) > max(WINDOW, STEP)
    assert min(len(ids) for ids, _ in expected) < STEP
    # Two prompts ending in "." must continue differently, or the tokens would
    # not depend on attention and parity would prove little.
    assert expected[2][1] != expected[4][1], "the preset ignores its context"
    block = {} if family in HYBRID_FAMILIES else dict(block_size=BLOCK)
    before = compilations()
    with in_process_llm(
        f"keras_hub:{shared.preset(family)}", **ENGINE, **block
    ) as llm:
        config = llm.llm_engine.vllm_config
        # vLLM's CPU platform turns its default VLLM_COMPILE into one Dynamo
        # trace compiled by Inductor (DYNAMO_TRACE_ONCE).
        assert config.compilation_config.mode.name in ("VLLM_COMPILE", "DYNAMO_TRACE_ONCE")
        assert config.compilation_config.backend == "inductor"
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        again = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        # Prefix-cache hits come in the scheduler's blocks: the least common
        # multiple of every KV cache group's block size (Gemma4's global and
        # sliding layers page apart).
        scheduler_block = llm.llm_engine.engine_core.engine_core.scheduler.block_size
        model = served_model(llm)
        record_features(family, model)
        # `compiled` stays False where vLLM loaded a saved compile instead.
        assert model.compiled or model.was_aot_compile_fn_loaded_from_disk
        assert not model.do_not_compile
        # Parity holds with the matmuls on vLLM's prepacked CPU GEMM (on the
        # CPU) and the experts on vLLM's fused MoE.
        assert model.cpu_gemm_layers > 0 or not current_platform.is_cpu()
        assert_experts_on_vllm(family, model)
        if family in KV_SHARING_FAMILIES:
            assert_kv_sharing(llm, model, family)
    # vLLM compiled this engine's graph, or loaded the compile an earlier
    # start saved (`saved_compile`): no silent fallback to eager.
    assert compilations() > before
    for column in ("batched", "chunked", "compiled"):
        assert_same_tokens(outputs, expected, family, column)
    if not block:
        return
    # Each prompt's whole blocks but the last token's came from the cache.
    support_matrix.record(family, TINY_FAMILIES[family][1], prefix_cache="FAIL")
    assert scheduler_block % BLOCK == 0
    cached = [output.num_cached_tokens for output in again]
    assert cached == [(len(ids) - 1) // scheduler_block * scheduler_block for ids, _ in expected]
    assert max(cached) > 0
    assert_same_tokens(again, expected, family, "prefix_cache")


def compilations():
    """vLLM's count of graphs compiled or loaded from a saved compile."""
    counter = compilation_counter
    return (
        counter.num_aot_compiles
        + counter.num_backend_compilations
        + counter.num_aot_artifacts_loaded
    )


def test_gpt_neox_generate_is_not_its_forward(shared):
    """KerasHub's GPT-NeoX `generate()` disagrees with its own forward.

    Why GPT-NeoX's parity oracle is the full-sequence forward. If this starts
    failing, KerasHub fixed its cached decode: drop `FULL_FORWARD_ORACLE`.
    """
    preset = shared.preset("gpt_neox")
    generated = shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS)
    forward = expected_tokens(shared, "gpt_neox")
    assert [ids for ids, _ in generated] == [ids for ids, _ in forward]
    # `generate()` prefills up to the shortest prompt; every later token, of
    # every prompt, comes from its cached decode.
    assert [tokens for _, tokens in generated] != [tokens for _, tokens in forward]


KV_SHARING_FAMILIES = ("gemma3n", "gemma4")


def assert_kv_sharing(llm, model, family):
    """The last 2 of 4 layers get no cache of their own, only their target's.

    That they attend correctly over it is the parity's job.
    """
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker
    runner = runner.worker.model_runner
    specs = model.attention_specs
    assert [spec.kv_sharing_target for spec in specs] == [None, None, 0, 1]
    names = [attention.layer_name for attention in model.attention]
    assert runner.shared_kv_cache_layers == {names[2]: names[0], names[3]: names[1]}
    # vLLM allocates caches for the first two only; each shared layer is
    # in its target's KV-cache group (sliding window or full attention).
    assert set(runner.get_kv_cache_spec()) == set(names[:2])
    groups = [set(g.layer_names) for g in runner.kv_cache_config.kv_cache_groups]
    assert sorted(groups, key=sorted) == [{names[0], names[2]}, {names[1], names[3]}]
    if family == "gemma4":
        # Global layers (odd) with their own head size and one K=V head.
        heads = [(spec.head_size, spec.num_kv_heads) for spec in specs]
        assert heads == [(32, 2), (128, 1)] * 2


def test_gemma4_task_logit_cap_reaches_the_logprobs(shared, tmp_path):
    """`Gemma4CausalLM(final_logit_cap=...)` caps logits after the backbone.

    Greedy tokens cannot show it (tanh keeps the argmax); logprobs do.
    """
    import json
    import shutil

    import keras
    import numpy as np
    import torch

    from vllm_keras_hub.export.sampling import causal_lm_class

    preset = str(tmp_path / "gemma4")
    shutil.copytree(shared.preset("gemma4"), preset)
    with open(tmp_path / "gemma4" / "task.json") as f:
        task = json.load(f)
    task["config"]["final_logit_cap"] = 2.0
    with open(tmp_path / "gemma4" / "task.json", "w") as f:
        json.dump(task, f)
    causal_lm = causal_lm_class(preset).from_preset(preset, preprocessor=None)
    assert causal_lm.final_logit_cap == 2.0
    with in_process_llm(f"keras_hub:{preset}") as llm:
        output = llm.generate(
            "Hello there", SamplingParams(max_tokens=1, logprobs=3), use_tqdm=False
        )[0]
    token_ids = np.array([output.prompt_token_ids])
    with torch.inference_mode():
        logits = causal_lm(
            {
                "token_ids": token_ids,
                "padding_mask": np.ones_like(token_ids),
                "position_ids": np.arange(token_ids.shape[1])[None],
            },
            training=False,
        )
    logits = torch.as_tensor(keras.ops.convert_to_numpy(logits))[0, -1]
    expected = torch.log_softmax(logits, -1)
    served = output.outputs[0].logprobs[0]
    assert len(served) >= 3
    for token_id, logprob in served.items():
        assert logprob.logprob == pytest.approx(float(expected[token_id]), abs=1e-4)


# The encoder each multimodal test preset carries, by its backbone attribute.
MEDIA_ENCODERS = {
    "gemma3": "vision_encoder",
    "gemma4": "vision_encoder",
    "gemma3n": "audio_encoder",
    "qwen3_5": "vision_encoder",
}


@pytest.mark.parametrize("family", sorted(MULTIMODAL))
def test_multimodal_presets_serve_text_as_generate(family, shared):
    """Presets with media encoders (Gemma3's `gemma3_4b` and up, all
    published Gemma3n, Gemma4 and Qwen3.5 ones).

    Their backbones' graphs demand image/audio inputs; serving runs their
    text path, and matches `generate()` (Qwen3.5: the full forward) on text
    prompts, batched and chunked beside decodes (eager: the compiled text
    path is the family's own row's). Their images: `vision*_test.py` (these
    test presets carry no image converter, or, Gemma4, no image tokens, so
    they serve text).
    """
    expected = expected_tokens(shared, family, multimodal=True)
    chunked = {k: v for k, v in ENGINE.items() if k != "enforce_eager"}
    with in_process_llm(
        f"keras_hub:{shared.preset(family, multimodal=True)}", **chunked
    ) as llm:
        backbone = served_model(llm).backbone
        encoder = MEDIA_ENCODERS[family]
        assert getattr(backbone, encoder, None) is not None, encoder
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    media = encoder.removesuffix("_encoder")
    row = f"{family} + {media} encoder"
    for column in ("batched", "chunked"):
        assert_same_tokens(outputs, expected, family, column, row=row)
