"""Drafters vLLM loads itself for a KerasHub target: EAGLE-3 heads and
Hugging Face draft models, checked against vLLM's native Llama.

Tiny Llama 3 and Gemma3 presets, and the Llama's weights exported by
keras-hub's own Hugging Face exporter. Each preset's EAGLE-3 head
(`testing/eagle3.py`) drafts the token the target just chose when it reads
the target's last layer output (aux layer 2 of 2), and other tokens
otherwise, so vLLM's acceptance counters show which hidden states reached
it: drafts are accepted exactly where the target repeats a token, which
`echo_acceptance` counts from the oracle's tokens. vLLM's native Llama with
the same head gives the same counts, so the count is vLLM's own behaviour.
Heads passing an intermediate layer through (aux slots 0 and 1, as vLLM's
default taps and published heads read lower layers) draft what the output
head reads off that layer: every draft row equals native Llama's.
"""

import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from tests.model_test import ENGINE
from tests.model_test import MAX_NEW_TOKENS
from tests.model_test import PROMPTS
from tests.speculative_test import acceptance
from tests.speculative_test import assert_oracle_tokens
from vllm_keras_hub.testing import mtp
from vllm_keras_hub.testing.eagle3 import save_echo_head
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.hf_models import export_preset

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
DRAFT_TOKENS = 3
# vLLM's aux layer indices on a 2-layer target: the embeddings, layer 0's
# output, layer 1's output (the one the echo head passes through).
AUX_LAYERS = (0, 1, 2)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("speculative_native")


@pytest.fixture(scope="module")
def llama(shared, root):
    """`(preset, hf_folder, eagle3_head, expected)` of the tiny Llama 3."""
    preset = shared.preset("llama3")
    hf_folder = export_preset(preset, str(root / "hf"), str(root / "ours"))
    head = save_echo_head(preset, str(root / "eagle3_llama3"), AUX_LAYERS)
    expected = shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS)
    return preset, hf_folder, head, expected


def eagle3(head):
    return {
        "method": "eagle3",
        "model": head,
        "num_speculative_tokens": DRAFT_TOKENS,
    }


def echo_acceptance(continued, max_tokens=MAX_NEW_TOKENS, draft_tokens=DRAFT_TOKENS):
    """`(drafted, accepted)` tokens if every draft repeats the last token.

    Each step drafts `draft_tokens` copies of the token just chosen; the
    target accepts the ones it repeats, then picks the next token itself.
    The last step's drafts may run past `max_tokens`, and vLLM counts the
    ones accepted there too, so `continued` holds each row's greedy tokens
    `draft_tokens` beyond `max_tokens`.
    """
    drafts = accepted = 0
    for tokens in continued:
        last = 0
        while last < max_tokens - 1:
            drafts += 1
            repeats = 0
            while repeats < draft_tokens and tokens[last + repeats + 1] == tokens[last]:
                repeats += 1
            accepted += repeats
            last += repeats + 1
    return drafts * draft_tokens, accepted


def check_echo_head(shared, preset, head, **settings):
    expected = shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS)
    continued = shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS + DRAFT_TOKENS)
    settings = dict(settings, speculative_config=eagle3(head), disable_log_stats=False)
    with in_process_llm(f"keras_hub:{preset}", **settings) as llm:
        assert llm.llm_engine.vllm_config.speculative_config.method == "eagle3"
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        counts = acceptance(llm)
    assert_oracle_tokens(outputs, expected)
    print(f"\nEAGLE-3 echo head: {counts[1]:.0f} of {counts[0]:.0f} accepted")
    assert counts[1] > 0
    assert counts == echo_acceptance([tokens for _, tokens in continued])


def test_an_eagle3_head_compiled_and_chunked(shared, llama):
    """Compiled, prefix caching on, prompts prefilled in chunks: the
    oracle's tokens, and acceptance where, and only where, the head read
    the target's last layer output."""
    preset, _, head, _ = llama
    check_echo_head(shared, preset, head, **ENGINE)


def test_an_eagle3_head_on_gemma3(shared, root):
    """Gemma3: sliding-window and full layers in their own KV cache groups,
    scaled embeddings, a `1 + scale` norm."""
    preset = shared.preset("gemma3")
    head = save_echo_head(preset, str(root / "eagle3_gemma3"), AUX_LAYERS)
    check_echo_head(shared, preset, head)


def test_vllm_native_llama_with_the_same_head_accepts_the_same(shared, llama):
    preset, hf_folder, head, expected = llama
    continued = shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS + DRAFT_TOKENS)
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
    assert counts == echo_acceptance([tokens for _, tokens in continued])


@pytest.mark.parametrize("slot", [0, 1], ids=["embeddings", "layer_0_output"])
def test_a_head_reading_an_intermediate_layer_drafts_as_vllm_native(
    shared, llama, root, slot
):
    """A head passing aux slot 0 (the input of layer 0) or 1 (of layer 1)
    through, eager, prefix caching on, prompts prefilled in chunks beside
    drafted decodes: `generate()`'s tokens, and every draft row the
    proposer returns is the one vLLM's native Llama returns with the same
    head on the exported weights, which taps its own layers."""
    preset, hf_folder, _, expected = llama
    head = save_echo_head(preset, str(root / f"eagle3_slot_{slot}"), AUX_LAYERS, slot=slot)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in expected]
    settings = dict(ENGINE, enforce_eager=True, speculative_config=eagle3(head))
    rows = []
    for model in (f"keras_hub:{preset}", hf_folder):
        with in_process_llm(model, **settings) as llm:
            with mtp.recorded_drafts(llm) as calls:
                outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert_oracle_tokens(outputs, expected)
        rows.append(calls)
    ours, native = rows
    assert ours == native
    # Not the echo head's drafts: the last layer's are the chosen tokens.
    drafts = [(t, d) for chosen, _, rows in ours for t, d in zip(chosen, rows, strict=True)]
    assert any(d != [t] * DRAFT_TOKENS for t, d in drafts)


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
