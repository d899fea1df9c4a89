"""T5Gemma `Seq2SeqLM` presets, served as BART's are (`tasks/seq_2_seq_lm/`).

A tiny random-weight T5Gemma (`testing/seq2seq.py`), saved with its
preprocessor as published presets are, served compiled: grouped-query,
rotary, soft-capped attention, a sliding decoder layer whose window the
outputs outgrow, an untied output embedding and a final soft cap. The
oracle is the preset's own greedy decoding (`keras_hub_greedy`).
"""

import pytest
from vllm import SamplingParams

from tests.model_test import compilations
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.seq2seq import build_tiny_t5gemma
from vllm_keras_hub.testing.seq2seq import keras_hub_greedy

TEXTS = [
    "hello",
    "the quick brown fox jumps over the lazy dog",
    "mars is red",
    "def main(): return 0 and more words here to make it longer than the rest",
]
NEW_TOKENS = 20
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return build_tiny_t5gemma(str(tmp_path_factory.mktemp("t5gemma")))


@pytest.fixture(scope="module")
def oracle(preset):
    return keras_hub_greedy(preset, TEXTS, NEW_TOKENS)


@pytest.fixture(scope="module")
def compiled_llm(preset):
    before = compilations()
    with in_process_llm(f"keras_hub:{preset}", max_model_len=128, enforce_eager=False) as llm:
        yield llm, compilations() - before


def tokens(outputs):
    return [(list(o.prompt_token_ids), list(o.outputs[0].token_ids)) for o in outputs]


def test_greedy_tokens_are_the_presets_own(compiled_llm, oracle):
    """Batched, as plain prompts, and one alone as in the batch; each
    text's 20 tokens differ from the others' and outgrow the window."""
    llm, compiled = compiled_llm
    prompts, outputs = oracle
    assert len({tuple(output) for output in outputs}) == len(TEXTS)
    assert min(len(output) for output in outputs) > 5
    assert tokens(llm.generate(TEXTS, GREEDY)) == list(zip(prompts, outputs))
    assert tokens(llm.generate(TEXTS[3:], GREEDY)) == [(prompts[3], outputs[3])]
    assert compiled > 0


def test_a_decoder_prompt_continues_as_the_presets(compiled_llm, preset):
    llm, _ = compiled_llm
    decoder_texts = ["the fox", "hello world"]
    expected = keras_hub_greedy(preset, TEXTS[1:3], NEW_TOKENS, decoder_texts)
    served = llm.generate(
        [
            {"encoder_prompt": {"prompt": "", "multi_modal_data": {"text": text}},
             "decoder_prompt": decoder}
            for text, decoder in zip(TEXTS[1:3], decoder_texts)
        ],
        GREEDY,
    )  # fmt: skip
    assert tokens(served) == list(zip(*expected))
    assert all(len(prompt) > 2 for prompt in expected[0])


def test_vllm_kernels_carry_the_presets_attention(compiled_llm):
    """Each decoder layer's kernels: its scale, soft cap, key/value heads,
    and the sliding layer's window (its 4 tokens back, and itself)."""
    model = served_model(compiled_llm[0])
    windows = [layer.impl.sliding_window for layer in model.self_attention]
    assert windows == [5, -1]  # vLLM CPU kernel: -1 for none
    for layer in [*model.self_attention, *model.cross_attention]:
        assert (layer.num_heads, layer.num_kv_heads, layer.head_size) == (2, 1, 32)
        assert layer.impl.scale == pytest.approx(32**-0.5)
        assert layer.impl.logits_soft_cap == 50.0
