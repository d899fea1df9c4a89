"""Gemma4 assistant presets as MTP drafters (vLLM's `mtp` method).

Greedy output with any drafter must be the target's own `generate()`
tokens. What the assistant drafts is checked draft by draft: every row the
engine's proposer returns equals the preset's own
`Gemma4AssistantCausalLM.call_with_cache` drafts, fed as vLLM feeds a
drafter (`testing/mtp.py`), and vLLM's native `Gemma4MTP` drafts the same
rows on the same weights. The tiny assistants are random, so almost none of
their drafts is accepted; the rows, not the acceptance, are the oracle.
"""

import keras_hub
import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from tests.model_test import ENGINE
from tests.model_test import PROMPTS
from tests.model_test import expected_tokens
from tests.speculative_test import GREEDY
from tests.speculative_test import acceptance
from tests.speculative_test import assert_oracle_tokens
from vllm_keras_hub.entrypoints.llm import KerasHubLLM
from vllm_keras_hub.export.preset_folder import write_model_folder
from vllm_keras_hub.speculative import UnsupportedSpeculativeConfigError
from vllm_keras_hub.testing import hf_gemma4
from vllm_keras_hub.testing import mtp
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.image_oracle import keras_hub_greedy_with_images
from vllm_keras_hub.testing.images import assert_tokens
from vllm_keras_hub.testing.images import batch_prompts
from vllm_keras_hub.testing.images import request
from vllm_keras_hub.testing.lora import random_lora
from vllm_keras_hub.testing.parallel import parallel_llm
from vllm_keras_hub.testing.presets import WINDOW
from vllm_keras_hub.testing.tokenizers import make_tokenizer
from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

DRAFT_TOKENS = 3
# Token prompts drafted for one at a time: one inside the sliding window,
# and one past it (prefilled in two chunks) twice, the second time from the
# prefix cache.
LONG = [2] + [(7 * i) % 500 + 3 for i in range(40)]
ONE_AT_A_TIME = ([2, 17, 45, 99, 312], LONG, LONG)
DECODE = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def assistant(shared):
    return shared.gemma4_assistant()


def drafting(assistant, **settings):
    return dict(
        speculative_config={
            "method": "mtp",
            "model": f"keras_hub:{assistant}",
            "num_speculative_tokens": DRAFT_TOKENS,
        },
        disable_log_stats=False,
        **settings,
    )


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_assistant_drafts_as_its_preset_and_changes_no_token(
    shared, assistant, compiled
):
    """A mixed batch, long prompts prefilled in chunks beside drafted
    decodes, prefix caching on: `generate()`'s tokens. Then prompts one at
    a time, one past the sliding window and once from the prefix cache:
    each draft is the preset's own."""
    target_preset = shared.preset("gemma4")
    assert len(LONG) > max(WINDOW, ENGINE["max_num_batched_tokens"])
    settings = drafting(assistant, **{**ENGINE, "enforce_eager": not compiled})
    recorded = []
    with in_process_llm(f"keras_hub:{target_preset}", **settings) as llm:
        runner = llm.llm_engine.engine_core.engine_core.model_executor
        drafter = runner.driver_worker.worker.model_runner.drafter
        assert type(drafter).__name__ == "Gemma4Proposer"
        assert type(drafter.model).__name__ == "KerasHubGemma4MTP"
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        batch_drafted, _ = acceptance(llm)
        # The drafter runs compiled beside a compiled target, as vLLM's own.
        assert getattr(drafter.model, "compiled", False) == compiled
        for prompt in ONE_AT_A_TIME:
            with mtp.recorded_drafts(llm) as calls:
                (output,) = llm.generate(
                    [TokensPrompt(prompt_token_ids=prompt)], DECODE, use_tqdm=False
                )
            recorded.append((prompt, list(output.outputs[0].token_ids), calls))
    assert_oracle_tokens(outputs, expected_tokens(shared, "gemma4"))
    assert batch_drafted > 0
    assert_drafts_are_the_presets(target_preset, assistant, recorded)


def assert_drafts_are_the_presets(target_preset, assistant, recorded):
    """Each `(prompt, generated, calls)`'s draft rows are the preset's own."""
    target = keras_hub.models.Gemma4CausalLM.from_preset(target_preset, preprocessor=None)
    drafter_preset = keras_hub.models.Gemma4AssistantCausalLM.from_preset(
        assistant, preprocessor=None
    )

    def oracle(tokens):
        return mtp.assistant_drafts(target, drafter_preset, tokens, DRAFT_TOKENS)

    checked = 0
    for prompt, generated, calls in recorded:
        got, expected = mtp.expected_calls(
            prompt + generated, len(prompt), calls, DRAFT_TOKENS, oracle
        )
        assert got == expected
        checked += len(got)
    print(f"\n{checked} draft steps of {DRAFT_TOKENS} tokens, each the preset's own")
    assert checked >= 20


def test_the_assistant_at_two_ranks_drafts_as_its_preset(shared, assistant, monkeypatch):
    """At 2 tensor-parallel ranks each rank holds its KV heads of the
    target's cache, and the assistant's blocks the query heads that read
    them: the batch gives `generate()`'s tokens, and both ranks' draft
    rows, prompt by prompt, are the preset's own."""
    # One core per rank, as `parallel_test.py` binds them.
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    target_preset = shared.preset("gemma4")
    settings = drafting(assistant, **{**ENGINE, "enforce_eager": True})
    recorded = []
    with parallel_llm(f"keras_hub:{target_preset}", tensor_parallel_size=2, **settings) as llm:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        heads = dict(llm.collective_rpc(mtp.drafter_heads))
        llm.collective_rpc(mtp.start_recording)
        for prompt in ONE_AT_A_TIME:
            (output,) = llm.generate(
                [TokensPrompt(prompt_token_ids=prompt)], DECODE, use_tqdm=False
            )
            calls = dict(llm.collective_rpc(mtp.recorded_calls))
            assert calls[0] == calls[1]
            recorded.append((prompt, list(output.outputs[0].token_ids), calls[0]))
    assert_oracle_tokens(outputs, expected_tokens(shared, "gemma4"))
    # Half of the 4 query heads on each rank; the sliding layer's 2 KV
    # heads split, the full layer's one replicated.
    assert heads == {0: [(2, 1), (2, 1)], 1: [(2, 1), (2, 1)]}
    assert_drafts_are_the_presets(target_preset, assistant, recorded)


def _drafted_one_at_a_time(llm, prompts):
    """Per prompt, its tokens and every `(chosen token, drafts)` row."""
    rows = []
    for prompt in prompts:
        with mtp.recorded_drafts(llm) as calls:
            (output,) = llm.generate(
                [TokensPrompt(prompt_token_ids=prompt)], DECODE, use_tqdm=False
            )
        rows.append(
            (list(output.outputs[0].token_ids), [(chosen, drafts) for chosen, _, drafts in calls])
        )
    return rows


def test_vllm_natives_gemma4_mtp_drafts_the_same_rows(shared, tmp_path):
    """Random transformers weights of a Gemma4 target and assistant: vLLM's
    native `Gemma4ForCausalLM` and `Gemma4MTP` serve the folders, ours the
    presets keras-hub's converters make of them. Every draft row, and every
    token, is the same, chunked prefills included.

    Native Gemma4 needs vLLM's CPU attention named: for heterogeneous head
    sizes vLLM picks Triton's (`Gemma4Config.verify_and_update_config`),
    which this CPU lacks. Its assistant runs without ordered embeddings:
    with them, vLLM's proposer captures CUDA graphs at load
    (`Gemma4Proposer._setup_centroids_cuda_graphs`), which fails on CPU."""
    tokenizer = make_tokenizer("gemma4")
    exported = str(tmp_path / "exported")
    write_model_folder(shared.preset("gemma4"), exported)
    hf_target, hf_assistant = hf_gemma4.save_hf_pair(
        str(tmp_path / "hf"), exported, tokenizer.vocabulary_size()
    )
    target, assistant = hf_gemma4.keras_hub_pair(
        hf_target, hf_assistant, str(tmp_path / "keras_hub"), tokenizer
    )
    spec = {"method": "mtp", "num_speculative_tokens": DRAFT_TOKENS}
    settings = {**ENGINE, "enforce_eager": True}
    with in_process_llm(
        hf_target,
        speculative_config={**spec, "model": hf_assistant},
        attention_config={"backend": "CPU_ATTN"},
        **settings,
    ) as llm:
        native = _drafted_one_at_a_time(llm, ONE_AT_A_TIME)
    with in_process_llm(
        f"keras_hub:{target}",
        speculative_config={**spec, "model": f"keras_hub:{assistant}"},
        **settings,
    ) as llm:
        ours = _drafted_one_at_a_time(llm, ONE_AT_A_TIME)
    assert ours == native
    drafts = {tuple(draft) for _, rows in ours for _, batch in rows for draft in batch}
    tokens = {token for generated, _ in ours for token in generated}
    print(f"\n{len(drafts)} distinct draft rows, {len(tokens)} distinct tokens")
    assert len(drafts) >= 15 and len(tokens) >= 5


def test_an_image_target_with_its_assistant_gives_generates_tokens(tmp_path):
    """A Gemma4 vision preset drafted for by its assistant, a batch of
    prompts with 0, 1 and 2 images, each image split over prefill steps,
    most prompts ending two tokens after an image: `generate()`'s tokens.
    The drafter takes no image embeddings (vLLM gives it the target's
    embedding of the placeholder token there), which changes what it
    drafts, never what the target chooses."""
    preset = build_tiny_vision_preset(str(tmp_path / "target"), "gemma4", seed=2)
    assistant = mtp.build_tiny_assistant(preset, str(tmp_path / "assistant"))
    prompts = batch_prompts("<|image|>")
    settings = drafting(
        assistant,
        max_model_len=1024,
        enable_chunked_prefill=True,
        max_num_batched_tokens=128,
        enable_prefix_caching=True,
        limit_mm_per_prompt={"image": 2},
        block_size=32,
    )
    with in_process_llm(f"keras_hub:{preset}", **settings) as llm:
        outputs = llm.generate([request(*p) for p in prompts], DECODE, use_tqdm=False)
        drafted, _ = acceptance(llm)
    assert_tokens(outputs, keras_hub_greedy_with_images(preset, prompts, DECODE.max_tokens))
    assert drafted > 0


def test_a_gemma4_assistant_is_refused_as_anything_else(shared, assistant):
    """As a target, and as a `draft_model` drafter, each with the reason."""
    with pytest.raises(UnsupportedSpeculativeConfigError, match="only drafts for a Gemma4"):
        KerasHubLLM(f"keras_hub:{assistant}")
    spec = {"model": f"keras_hub:{assistant}", "num_speculative_tokens": 2}
    with pytest.raises(UnsupportedSpeculativeConfigError, match="as method 'mtp'"):
        KerasHubLLM(f"keras_hub:{shared.preset('gemma4')}", speculative_config=spec)


def test_a_merged_adapter_with_an_assistant_is_refused(shared, assistant, tmp_path):
    """vLLM loads the drafter with the target's load config, so the adapter
    merged into the target would reach the assistant too."""
    target = shared.preset("gemma4")
    adapter = random_lora(target, str(tmp_path / "gemma4.lora.h5"))
    with pytest.raises(
        UnsupportedSpeculativeConfigError,
        match="cannot draft for a target with a merged adapter",
    ):
        KerasHubLLM(f"keras_hub:{target}", lora_weights=adapter, **drafting(assistant))


# Refused before an engine starts, with the reason.
def _refusals(shared, assistant):
    spec = drafting(assistant)["speculative_config"]
    return {
        "another family's target": (
            shared.preset("llama"), dict(speculative_config=spec), "served for Gemma4 targets"
        ),
        "not an assistant": (
            shared.preset("gemma4"),
            dict(speculative_config={**spec, "model": f"keras_hub:{shared.preset('gemma4')}"}),
            "needs an assistant preset",
        ),
        "no assistant": (
            shared.preset("gemma4"),
            dict(speculative_config={"method": "mtp", "num_speculative_tokens": 2}),
            "takes a KerasHub Gemma4 assistant preset",
        ),
        "pipeline parallel": (
            shared.preset("gemma4"),
            dict(speculative_config=spec, pipeline_parallel_size=2),
            "builds the drafter on the last stage only",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "another family's target",
        "not an assistant",
        "no assistant",
        "pipeline parallel",
    ],
)
def test_refused_at_start_up(case, shared, assistant):
    target, settings, reason = _refusals(shared, assistant)[case]
    with pytest.raises(UnsupportedSpeculativeConfigError, match=reason):
        KerasHubLLM(f"keras_hub:{target}", **settings)
