"""Drafters vLLM loads itself for a KerasHub target: EAGLE-3 heads and
Hugging Face draft models, checked against vLLM's native Llama.

A tiny Llama 3 preset, and the same weights exported by keras-hub's own
Hugging Face exporter. Its EAGLE-3 head (`testing/eagle3.py`) drafts the
token the target just chose when it reads the target's last layer output
(aux layer 2 of 2), and other tokens otherwise, so vLLM's acceptance
counters show which hidden states reached it: drafts are accepted exactly
where the target repeats a token, which `echo_acceptance` counts from the
oracle's tokens. vLLM's native Llama with the same head gives the same
counts, so the count is vLLM's own behaviour.
"""

import os
import shutil

import pytest
from keras_hub.src.utils.transformers.export.hf_exporter import export_to_safetensors
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from tests.model_test import ENGINE
from tests.model_test import MAX_NEW_TOKENS
from tests.model_test import PROMPTS
from tests.speculative_test import acceptance
from tests.speculative_test import assert_oracle_tokens
from vllm_keras_hub.export.preset_folder import write_model_folder
from vllm_keras_hub.export.sampling import causal_lm_class
from vllm_keras_hub.testing.eagle3 import save_echo_head
from vllm_keras_hub.testing.engines import in_process_llm

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
DRAFT_TOKENS = 3
# vLLM's aux layer indices on a 2-layer target: the embeddings, layer 0's
# output, layer 1's output (the one the echo head passes through).
AUX_LAYERS = (0, 1, 2)


@pytest.fixture(scope="module")
def llama(shared, tmp_path_factory):
    """`(preset, hf_folder, eagle3_head, expected)` of the tiny Llama 3."""
    root = tmp_path_factory.mktemp("speculative_native")
    preset = shared.preset("llama3")
    hf_folder = str(root / "hf")
    export_to_safetensors(causal_lm_class(preset).from_preset(preset), hf_folder)
    # Ours (`tokenizer.json`) loads without sentencepiece.
    ours = str(root / "ours")
    write_model_folder(preset, ours)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(ours, name), hf_folder)
    head = save_echo_head(preset, str(root / "eagle3"), AUX_LAYERS)
    expected = shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS)
    return preset, hf_folder, head, expected


def eagle3(head):
    return {
        "method": "eagle3",
        "model": head,
        "num_speculative_tokens": DRAFT_TOKENS,
    }


def echo_acceptance(generated, draft_tokens=DRAFT_TOKENS):
    """`(drafted, accepted)` tokens if every draft repeats the last token.

    Each step drafts `draft_tokens` copies of the token just chosen; the
    target accepts the ones it repeats, then picks the next token itself.
    """
    drafts = accepted = 0
    for tokens in generated:
        last = 0
        while last < len(tokens) - 1:
            drafts += 1
            repeats = 0
            while (
                repeats < draft_tokens
                and last + repeats + 1 < len(tokens)
                and tokens[last + repeats + 1] == tokens[last]
            ):
                repeats += 1
            accepted += repeats
            last += repeats + 1
    return drafts * draft_tokens, accepted


def test_an_eagle3_head_compiled_and_chunked(llama):
    """Compiled, prefix caching on, prompts prefilled in chunks: the
    oracle's tokens, and acceptance where, and only where, the head read
    the target's last layer output."""
    preset, _, head, expected = llama
    settings = dict(ENGINE, speculative_config=eagle3(head), disable_log_stats=False)
    with in_process_llm(f"keras_hub:{preset}", **settings) as llm:
        assert llm.llm_engine.vllm_config.speculative_config.method == "eagle3"
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        counts = acceptance(llm)
    assert_oracle_tokens(outputs, expected)
    generated = [tokens for _, tokens in expected]
    print(f"\nEAGLE-3 echo head: {counts[1]:.0f} of {counts[0]:.0f} accepted")
    assert counts[1] > 0
    assert counts == echo_acceptance(generated)


def test_vllm_native_llama_with_the_same_head_accepts_the_same(llama):
    _, hf_folder, head, expected = llama
    settings = dict(
        enforce_eager=True,
        speculative_config=eagle3(head),
        disable_log_stats=False,
    )
    with in_process_llm(hf_folder, **settings) as llm:
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids, _ in expected],
            GREEDY,
            use_tqdm=False,
        )
        counts = acceptance(llm)
    assert_oracle_tokens(outputs, expected)
    assert counts == echo_acceptance([tokens for _, tokens in expected])


def test_a_hugging_face_draft_model(llama):
    """The preset's own weights in Hugging Face's format, drafting through
    vLLM's native Llama for the KerasHub target: every draft accepted."""
    preset, hf_folder, _, expected = llama
    spec = {"model": hf_folder, "num_speculative_tokens": DRAFT_TOKENS}
    settings = dict(
        enforce_eager=True,
        speculative_config=spec,
        disable_log_stats=False,
    )
    with in_process_llm(f"keras_hub:{preset}", **settings) as llm:
        assert llm.llm_engine.vllm_config.speculative_config.method == "draft_model"
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        drafted, accepted = acceptance(llm)
    assert_oracle_tokens(outputs, expected)
    assert accepted / drafted >= 0.95
