"""Engine features in vLLM's default compiled mode, on one compiled engine.

`features_test.py` proves each feature eager: against the preset's own model
or vLLM's native one. Users get compiled mode, so here the same requests go
to an eager and a compiled engine of one tiny Llama3 preset (prefix caching
on, prefill chunked by a small step budget), which must agree: greedy tokens
under penalties and structured outputs (regex and choice: bounded, where a
random model's JSON might never close), chosen-token and prompt logprobs,
and a prefix-cache hit in the compiled engine. The compiled engine must
really be compiled (vLLM's compile counter moves).
"""

import re

import pytest
from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams

from tests.features_test import LOGPROB_TOLERANCE
from tests.features_test import PREFIX_CACHE_COUNTERS
from tests.features_test import QUESTIONS
from tests.features_test import SHARED_PREFIX
from tests.features_test import counters
from tests.model_test import compilations
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.presets import build_tiny_preset

SETTINGS = dict(
    max_model_len=2048,
    enable_prefix_caching=True,
    enable_chunked_prefill=True,
    max_num_batched_tokens=64,
    disable_log_stats=False,
)
PROMPTS = ["The quick brown fox", "def main():", "In 2024 the model had"]
REGEX = r"[a-z]{3}-\d{2}"
CHOICES = ["red", "green", "blue"]


# 16 tokens: enough for the tiny preset's greedy text to repeat itself, so
# that each penalty changes it.
def greedy(max_tokens=16, **kwargs):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


# Each case: prompts and their sampling parameters.
CASES = {
    "logprobs": greedy(logprobs=3, prompt_logprobs=2),
    "repetition_penalty": greedy(repetition_penalty=1.5),
    "presence_penalty": greedy(presence_penalty=1.5),
    "frequency_penalty": greedy(frequency_penalty=1.5),
    "regex": SamplingParams(
        temperature=0.0, max_tokens=16, structured_outputs=StructuredOutputsParams(regex=REGEX)
    ),
    "choice": SamplingParams(
        temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=CHOICES)
    ),
}


def run(llm):
    """Every case's outputs, then the prefix-cache requests'."""
    results = {
        name: llm.generate(PROMPTS, params, use_tqdm=False) for name, params in CASES.items()
    }
    prompts = [SHARED_PREFIX + question for question in QUESTIONS]
    before = counters(llm, *PREFIX_CACHE_COUNTERS)
    cached = llm.generate(prompts[:1], greedy(), use_tqdm=False)
    cached += llm.generate(prompts[1:], greedy(), use_tqdm=False)
    after = counters(llm, *PREFIX_CACHE_COUNTERS)
    results["prefix"] = cached
    hits = after["vllm:prefix_cache_hits"] - before["vllm:prefix_cache_hits"]
    return results, hits


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    model = f"keras_hub:{build_tiny_preset('llama3', str(tmp_path_factory.mktemp('llama3')))}"
    with in_process_llm(model, **SETTINGS) as llm:
        eager = run(llm)
    before = compilations()
    with in_process_llm(model, **SETTINGS, enforce_eager=False) as llm:
        served = served_model(llm)
        assert not served.do_not_compile
        block_size = llm.llm_engine.vllm_config.cache_config.block_size
        prefix_tokens = len(llm.get_tokenizer().encode(SHARED_PREFIX))
        compiled = run(llm)
        # Compiled, or loaded the compile an earlier start saved.
        assert served.compiled or served.was_aot_compile_fn_loaded_from_disk
    assert compilations() > before, "the compiled engine compiled nothing"
    assert prefix_tokens >= block_size, (prefix_tokens, block_size)
    return {"eager": eager, "compiled": compiled, "full_blocks": prefix_tokens // block_size * block_size}


def tokens(outputs):
    return [list(output.outputs[0].token_ids) for output in outputs]


@pytest.mark.parametrize("case", [*CASES, "prefix"])
def test_compiled_gives_eagers_tokens(runs, case):
    (eager, _), (compiled, _) = runs["eager"], runs["compiled"]
    assert tokens(compiled[case]) == tokens(eager[case])


def test_penalties_change_the_compiled_engines_output(runs):
    compiled, _ = runs["compiled"]
    plain = tokens(compiled["logprobs"])
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        assert tokens(compiled[name]) != plain, name


def test_structured_outputs_hold_in_compiled_mode(runs):
    compiled, _ = runs["compiled"]
    regex = [output.outputs[0].text for output in compiled["regex"]]
    choice = [output.outputs[0].text for output in compiled["choice"]]
    print(f"\ncompiled regex {regex}, choice {choice}")
    assert all(re.fullmatch(REGEX, text) for text in regex), regex
    assert all(text in CHOICES for text in choice), choice


def test_compiled_logprobs_match_eager(runs):
    (eager, _), (compiled, _) = runs["eager"], runs["compiled"]
    diffs = []
    for ours, theirs in zip(compiled["logprobs"], eager["logprobs"], strict=True):
        for got, want in zip(ours.outputs[0].logprobs, theirs.outputs[0].logprobs, strict=True):
            assert got.keys() == want.keys()
            diffs += [abs(got[t].logprob - want[t].logprob) for t in got]
        for got, want in zip(ours.prompt_logprobs[1:], theirs.prompt_logprobs[1:], strict=True):
            assert got.keys() == want.keys()
            diffs += [abs(got[t].logprob - want[t].logprob) for t in got]
    print(f"\ncompiled vs eager logprobs: max |diff| {max(diffs):.2e} over {len(diffs)}")
    assert max(diffs) < LOGPROB_TOLERANCE


def test_prefix_caching_hits_in_compiled_mode(runs):
    compiled, hits = runs["compiled"]
    cached = compiled["prefix"]
    assert cached[0].num_cached_tokens == 0
    assert all(o.num_cached_tokens >= runs["full_blocks"] for o in cached[1:])
    assert hits >= 2 * runs["full_blocks"]
