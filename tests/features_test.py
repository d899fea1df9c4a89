"""vLLM engine features on KerasHub-served models.

Prefix caching, chunked prefill, structured outputs, n-gram speculative
decoding, sampling options, weight dtypes, KerasHub int8 quantization and data
parallelism, each through the real vLLM engine serving a preset's own KerasHub
layers. Where text matters the model is the real SmolLM2-135M-Instruct preset
in float32; elsewhere a tiny random-weight preset.

Engines are started on first use and shared by the tests that follow with
the same settings; at most one runs at a time. Each test asks for its engine
by its settings, so any order gives the same results; the file's order only
makes each setting start once.
"""

import contextlib
import json
import re

import jsonschema
import keras
import keras_hub
import numpy as np
import pytest
from vllm import LLM
from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams

from vllm_keras_hub import smollm2
from vllm_keras_hub.entrypoints.llm import KerasHubLLM
from vllm_keras_hub.loading.load_format import backbone_dtype
from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS
from vllm_keras_hub.testing.engines import in_process_engine_env
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.oracle import keras_hub_greedy
from vllm_keras_hub.testing.presets import build_tiny_preset
from vllm_keras_hub.testing.server import free_port
from vllm_keras_hub.testing.server import greedy_ids
from vllm_keras_hub.testing.server import requests_per_engine
from vllm_keras_hub.testing.server import running_server
from vllm_keras_hub.testing.server import serve_command

# SmolLM2 engines: vLLM's defaults (prefix caching on, chunked prefill with a
# large budget, block size 128 on CPU) unless a test's feature says otherwise.
# Stats on, so `get_metrics()` reads the prefix-cache and spec-decode counters.
SMOL_SETTINGS = dict(max_model_len=1024, dtype="float32", disable_log_stats=False)
SMOL_ENGINES = {
    "default": {},
    "no_prefix_caching": dict(enable_prefix_caching=False),
    "budget_32": dict(max_num_batched_tokens=32, enable_chunked_prefill=True),
    "ngram": dict(
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 2,
        }
    ),
}


def greedy(max_tokens, **kwargs):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kwargs)


def token_ids(outputs):
    return [list(o.outputs[0].token_ids) for o in outputs]


def counters(llm, *names):
    """Sums of vLLM's Prometheus counters `names`, over their labels."""
    totals = dict.fromkeys(names, 0.0)
    for metric in llm.get_metrics():
        if metric.name in totals:
            totals[metric.name] += metric.value
    return totals


@contextlib.contextmanager
def native_llm(folder, **kwargs):
    """vLLM's own model for a Hugging Face folder, in this process."""
    with in_process_engine_env():
        # vLLM's default reserves 92% of RAM on the CPU: the test engines'
        # KV cache instead.
        kwargs.setdefault("kv_cache_memory_bytes", TEST_ENGINE_KWARGS["kv_cache_memory_bytes"])
        llm = LLM(folder, distributed_executor_backend="uni", seed=0, **kwargs)
        try:
            yield llm
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm


class Engines:
    """Engines by name, started on first use; starting one closes the last."""

    def __init__(self, factories):
        self._factories = factories
        self._name = None
        self._llm = None
        self._stack = contextlib.ExitStack()
        self.started = []

    def __call__(self, name):
        if name != self._name:
            self.close()
            self._llm = self._stack.enter_context(self._factories[name]())
            self._name = name
            self.started.append(name)
        return self._llm

    def close(self):
        self._stack.close()
        self._name = self._llm = None


@pytest.fixture(scope="module")
def smol_preset():
    return smollm2.default_preset_dir()


@pytest.fixture(scope="module")
def tiny_presets(tmp_path_factory):
    """A tiny Llama3 preset, and the same weights `quantize("int8")`-ed."""
    plain = build_tiny_preset("llama3", str(tmp_path_factory.mktemp("llama3")))
    causal_lm = keras_hub.models.CausalLM.from_preset(plain)
    causal_lm.backbone.quantize("int8")
    quantized = str(tmp_path_factory.mktemp("llama3_int8"))
    causal_lm.save_to_preset(quantized)
    return {"plain": plain, "int8": quantized}


@pytest.fixture(scope="module")
def engines(smol_preset, tiny_presets, tmp_path_factory):
    model = f"keras_hub:{smol_preset}"

    def smol(settings):
        return lambda: in_process_llm(model, **SMOL_SETTINGS, **settings)

    def native():
        folder = str(tmp_path_factory.mktemp("hf_llama"))
        smollm2.export_hf_llama(smol_preset, folder)
        return native_llm(folder, **SMOL_SETTINGS, enforce_eager=True)

    @contextlib.contextmanager
    def spawned(settings):
        # Eager: speculation is what is tested, not compiling.
        llm = KerasHubLLM(model, seed=0, enforce_eager=True, **SMOL_SETTINGS, **settings)
        try:
            yield llm
        finally:
            llm.close()

    factories = {name: smol(settings) for name, settings in SMOL_ENGINES.items()}
    # In its own processes: see test_ngram_speculative_decoding.
    factories["ngram"] = lambda: spawned(SMOL_ENGINES["ngram"])
    factories["native"] = native
    factories["tiny_float32"] = lambda: in_process_llm(
        f"keras_hub:{tiny_presets['plain']}", dtype="float32"
    )
    factories["tiny_bfloat16"] = lambda: in_process_llm(
        f"keras_hub:{tiny_presets['plain']}", dtype="bfloat16"
    )
    factories["tiny_int8"] = lambda: in_process_llm(
        f"keras_hub:{tiny_presets['int8']}", dtype="float32"
    )
    manager = Engines(factories)
    yield manager
    manager.close()
    print(f"\nengines started: {manager.started}")


# ---------------------------------------------------------------------------
# Baselines: the default SmolLM2 engine's greedy tokens, which the other
# engine settings must reproduce.

# About 290 tokens: with a 32-token budget it prefills in 10+ chunks.
LONG_PROMPT = (
    "KerasHub is a library of pretrained models built on Keras 3. Each model "
    "is a backbone, which maps token ids to hidden states, and a task, which "
    "adds a head and a preprocessor. A causal language model predicts the next "
    "token from all the tokens before it; served by vLLM, its attention reads "
    "keys and values from a paged cache, so that many requests share memory "
    "in fixed-size blocks. "
) * 3 + "In one sentence, the main idea of this text is"
SHORT_PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "def add(a, b):"]
# Repetitive text, where n-gram lookup in the prompt finds good drafts.
REPETITIVE_PROMPTS = [
    "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3,",
    "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. "
    "The dog sat on the log. The cat sat on the mat.",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\n"
    "for k in range(10):\n",
]
CHUNK_TOKENS = 8
SPEC_TOKENS = 24


@pytest.fixture(scope="module")
def baseline(engines):
    """Greedy tokens of the default engine for the comparison tests."""
    chunk_prompts = SHORT_PROMPTS + [LONG_PROMPT]
    outputs = engines("default").generate(
        chunk_prompts + REPETITIVE_PROMPTS,
        [greedy(CHUNK_TOKENS, ignore_eos=True)] * len(chunk_prompts)
        + [greedy(SPEC_TOKENS, ignore_eos=True)] * len(REPETITIVE_PROMPTS),
        use_tqdm=False,
    )
    return {"chunk": outputs[: len(chunk_prompts)], "spec": outputs[len(chunk_prompts) :]}


# ---------------------------------------------------------------------------
# Logprobs and prompt logprobs against vLLM's native Llama on the same weights.

LOGPROB_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,"]
# Measured at most 2e-5 on this machine (float32; different matmul blocking
# and attention kernels); the bound is five times that.
LOGPROB_TOLERANCE = 1e-4


def logprob_run(llm):
    params = greedy(8, logprobs=2, prompt_logprobs=1)
    outputs = llm.generate(LOGPROB_PROMPTS, params, use_tqdm=False)
    chosen, prompt = [], []
    for output in outputs:
        sample = output.outputs[0]
        assert all(len(step) <= 3 for step in sample.logprobs)
        steps = zip(sample.logprobs, sample.token_ids, strict=True)
        chosen.append([step[t].logprob for step, t in steps])
        # Position 0 has no logprob; the others score the prompt's tokens.
        assert output.prompt_logprobs[0] is None
        steps = zip(output.prompt_logprobs[1:], output.prompt_token_ids[1:], strict=True)
        prompt.append([step[t].logprob for step, t in steps])
    return token_ids(outputs), chosen, prompt


def test_logprobs_match_vllm_native(engines):
    native_tokens, native_chosen, native_prompt = logprob_run(engines("native"))
    tokens, chosen, prompt = logprob_run(engines("default"))
    assert tokens == native_tokens

    def max_diff(xs, ys):
        assert [len(x) for x in xs] == [len(y) for y in ys]
        return max(
            abs(a - b)
            for x, y in zip(xs, ys, strict=True)
            for a, b in zip(x, y, strict=True)
        )

    chosen_diff, prompt_diff = max_diff(chosen, native_chosen), max_diff(prompt, native_prompt)
    print(
        f"\nlogprobs vs native: chosen max |diff| {chosen_diff:.2e}, "
        f"prompt max |diff| {prompt_diff:.2e}"
    )
    assert chosen_diff < LOGPROB_TOLERANCE
    assert prompt_diff < LOGPROB_TOLERANCE


# ---------------------------------------------------------------------------
# Structured outputs (default engine).

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def chat(llm, content, params):
    messages = [{"role": "user", "content": content}]
    [output] = llm.chat(messages, params, use_tqdm=False)
    return output.outputs[0]


def test_structured_json_schema(engines):
    llm = engines("default")
    params = greedy(96, structured_outputs=StructuredOutputsParams(json=PERSON_SCHEMA))
    output = chat(
        llm, "Describe Alice, a 30 year old from Paris, as a JSON object.", params
    )
    print(f"\njson schema: {output.text!r}")
    assert output.finish_reason == "stop", output.text
    jsonschema.validate(json.loads(output.text), PERSON_SCHEMA)


def test_structured_regex(engines):
    llm = engines("default")
    pattern = r"\(\d{3}\) \d{3}-\d{4}"
    params = greedy(32, structured_outputs=StructuredOutputsParams(regex=pattern))
    output = chat(llm, "Write a US phone number.", params)
    print(f"\nregex: {output.text!r}")
    assert re.fullmatch(pattern, output.text), output.text


def test_structured_choice(engines):
    llm = engines("default")
    choices = ["positive", "negative", "neutral"]
    params = greedy(8, structured_outputs=StructuredOutputsParams(choice=choices))
    outputs = [
        chat(llm, f"Is the sentiment of this review {', '.join(choices)}? {review}", params)
        for review in ["I love it, it is wonderful!", "Awful. It broke on day one."]
    ]
    print(f"\nchoice: {[o.text for o in outputs]}")
    assert all(o.text in choices for o in outputs), [o.text for o in outputs]
    # Without the constraint the model answers in free text.
    free = chat(llm, f"Is the sentiment of this review {', '.join(choices)}? Meh.", greedy(8))
    assert free.text not in choices


# ---------------------------------------------------------------------------
# Sampling options (default engine).

COUNTING = "1, 2, 3, 4, 5,"
STORY = "Once upon a time, in a small village,"


def test_n_samples(engines):
    llm = engines("default")
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8)
    [output] = llm.generate([STORY], params, use_tqdm=False)
    texts = [sample.text for sample in output.outputs]
    assert len(texts) == 3
    assert len(set(texts)) > 1, texts


def test_seed_reproducible_across_calls(engines):
    llm = engines("default")

    def sampled(seed):
        return SamplingParams(temperature=1.0, seed=seed, max_tokens=8)

    # Different batch companions each time: they must not disturb a seed.
    first, other = token_ids(
        llm.generate([STORY, STORY], [sampled(1234), sampled(99)], use_tqdm=False)
    )
    [_, again] = token_ids(
        llm.generate([COUNTING, STORY], [greedy(8), sampled(1234)], use_tqdm=False)
    )
    assert first == again
    assert first != other


def test_stop_strings_and_stop_token_ids(engines):
    llm = engines("default")
    [full] = llm.generate([COUNTING], greedy(10, ignore_eos=True), use_tqdm=False)
    text, ids = full.outputs[0].text, list(full.outputs[0].token_ids)
    assert text.startswith(" 6, 7, 8"), text
    # A token first generated at step 4 or later: generation ends with it.
    index = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i])

    by_string, by_id = llm.generate(
        [COUNTING, COUNTING],
        [greedy(10, stop=[" 8"]), greedy(10, stop_token_ids=[ids[index]])],
        use_tqdm=False,
    )
    assert by_string.outputs[0].text == text[: text.index(" 8")]
    assert by_string.outputs[0].finish_reason == "stop"
    assert by_string.outputs[0].stop_reason == " 8"
    assert list(by_id.outputs[0].token_ids) == ids[: index + 1]
    assert by_id.outputs[0].finish_reason == "stop"
    assert by_id.outputs[0].stop_reason == ids[index]


def test_min_tokens(engines):
    llm = engines("default")
    # An answer already given: the model ends its turn at once.
    prompt = "<|im_start|>user\nSay yes.<|im_end|>\n<|im_start|>assistant\nYes."
    end_id = llm.get_tokenizer().convert_tokens_to_ids("<|im_end|>")
    plain, forced = llm.generate(
        [prompt, prompt], [greedy(8), greedy(8, min_tokens=4)], use_tqdm=False
    )
    plain, forced = plain.outputs[0], forced.outputs[0]
    print(f"\nmin_tokens=4: {list(plain.token_ids)} -> {list(forced.token_ids)}")
    assert list(plain.token_ids) == [end_id]
    assert len(forced.token_ids) >= 4
    assert end_id not in forced.token_ids[:4]


PENALTIES = {
    "presence_penalty": 1.5,
    "frequency_penalty": 1.5,
    "repetition_penalty": 1.5,
}


@pytest.fixture(scope="module")
def penalised(engines):
    """Greedy tokens on a repetitive prompt: plain, then with each penalty."""
    prompt = "the the the the the the the the"
    params = [greedy(12, ignore_eos=True)] + [
        greedy(12, ignore_eos=True, **{name: value}) for name, value in PENALTIES.items()
    ]
    outputs = engines("default").generate([prompt] * len(params), params, use_tqdm=False)
    return dict(zip(["plain", *PENALTIES], outputs, strict=True))


@pytest.mark.parametrize("penalty", list(PENALTIES))
def test_penalties_change_greedy_output(penalised, penalty):
    plain, changed = penalised["plain"].outputs[0], penalised[penalty].outputs[0]
    print(f"\n{penalty}: {plain.text!r} -> {changed.text!r}")
    assert list(changed.token_ids) != list(plain.token_ids)
    # Penalising repeats gives more distinct tokens, not fewer.
    assert len(set(changed.token_ids)) >= len(set(plain.token_ids))


# ---------------------------------------------------------------------------
# Automatic prefix caching: default engine, then one with caching off.

# Shared by every request: well over 3 blocks of 128 tokens (checked).
SHARED_PREFIX = (
    "You are given a manual. Section 1: the device has three buttons, red, "
    "green and blue. The red button turns it off, the green one turns it on "
    "and the blue one resets it to factory settings. Section 2: the battery "
    "lasts ten hours and charges in two. Section 3: clean it with a dry cloth. "
) * 6
QUESTIONS = [
    "Question: which button turns the device on? Answer:",
    "Question: how long does the battery last? Answer:",
    "Question: how should it be cleaned? Answer:",
]
PREFIX_CACHE_COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")


def test_prefix_caching_hits_and_same_output(engines, baseline):
    prompts = [SHARED_PREFIX + q for q in QUESTIONS]
    params = greedy(6, ignore_eos=True)
    llm = engines("default")
    block_size = llm.llm_engine.vllm_config.cache_config.block_size
    assert llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    prefix_tokens = len(llm.get_tokenizer().encode(SHARED_PREFIX))
    assert prefix_tokens >= 3 * block_size, (prefix_tokens, block_size)

    before = counters(llm, *PREFIX_CACHE_COUNTERS)
    cached = llm.generate(prompts[:1], params, use_tqdm=False)
    cached += llm.generate(prompts[1:], params, use_tqdm=False)
    after = counters(llm, *PREFIX_CACHE_COUNTERS)
    hits = after["vllm:prefix_cache_hits"] - before["vllm:prefix_cache_hits"]
    queries = after["vllm:prefix_cache_queries"] - before["vllm:prefix_cache_queries"]
    print(
        f"\nblock size {block_size}, shared prefix {prefix_tokens} tokens; "
        f"cached tokens per request {[o.num_cached_tokens for o in cached]}; "
        f"prefix cache hits {hits:.0f} of {queries:.0f} queried tokens"
    )
    full_blocks = prefix_tokens // block_size * block_size
    # The first request of the prefix finds nothing; the others its blocks.
    assert cached[0].num_cached_tokens == 0
    assert all(o.num_cached_tokens >= full_blocks for o in cached[1:])
    assert hits >= 2 * full_blocks

    llm = engines("no_prefix_caching")
    uncached = llm.generate(prompts, params, use_tqdm=False)
    assert all(not o.num_cached_tokens for o in uncached)
    assert token_ids(cached) == token_ids(uncached)


# ---------------------------------------------------------------------------
# Chunked prefill: a 32-token budget per step.


def test_chunked_prefill_same_tokens(engines, baseline):
    llm = engines("budget_32")
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    assert scheduler.max_num_batched_tokens == 32
    # Short prompts first: they decode while the long one prefills in chunks.
    outputs = llm.generate(
        SHORT_PROMPTS + [LONG_PROMPT],
        greedy(CHUNK_TOKENS, ignore_eos=True),
        use_tqdm=False,
    )
    long_tokens = len(outputs[-1].prompt_token_ids)
    print(f"\nlong prompt {long_tokens} tokens, budget 32 tokens per step")
    assert long_tokens > 250
    assert token_ids(outputs) == token_ids(baseline["chunk"])


# ---------------------------------------------------------------------------
# Weight dtypes and KerasHub int8 quantization, on a tiny Llama3 preset.

TINY_PROMPTS = [
    "a",
    "Hello there",
    "The quick brown fox jumps over the lazy dog.",
    "KerasHub models served by vLLM use a paged KV cache.",
]
TINY_TOKENS = 12


def served_ids(llm):
    outputs = llm.generate(TINY_PROMPTS, greedy(TINY_TOKENS, ignore_eos=True), use_tqdm=False)
    return [(o.prompt_token_ids, list(o.outputs[0].token_ids)) for o in outputs]


def oracle_ids(preset, dtype):
    return [
        (list(p), list(g)) for p, g in keras_hub_greedy(preset, TINY_PROMPTS, TINY_TOKENS, dtype)
    ]


def test_backbone_dtype_keeps_a_quantized_presets_map(tiny_presets):
    assert backbone_dtype(tiny_presets["plain"], "bfloat16") == "bfloat16"
    policy = keras.dtype_policies.get(backbone_dtype(tiny_presets["int8"], "bfloat16"))
    assert isinstance(policy, keras.dtype_policies.DTypePolicyMap)
    assert policy.default_policy.name == "bfloat16"
    assert policy["token_embedding"].name == "int8_from_bfloat16"


def test_int8_quantized_preset(engines, tiny_presets):
    # The quantized model's own generate(), in its saved dtype policy map
    # (`dtype=None`: an explicit dtype would replace the map, see
    # `backbone_dtype`).
    expected = oracle_ids(tiny_presets["int8"], None)
    llm = engines("tiny_int8")
    backbone = served_model(llm).backbone
    quantized = [l for l in backbone._flatten_layers() if l.quantization_mode == "int8"]
    # Per layer: q, k, v, output and 3 feed-forward projections; the embedding.
    assert len(quantized) == 7 * backbone.num_layers + 1
    assert any(str(v.dtype) == "int8" for v in backbone.weights)
    assert served_ids(llm) == expected


# bfloat16 logits are rounded to a few significant bits: KerasHub's own
# generate() and a teacher-forced forward pass of the same bfloat16 model can
# already break an exact tie differently, and after one different token a
# row's context differs. So every served bfloat16 token is checked against
# the preset's own bfloat16 model on the served context itself: it must be
# within this of that step's top logit (about 4 bfloat16 ulps at the tiny
# preset's logits of 5-10), and most must be its exact argmax.
BFLOAT16_TIE = 0.125
BFLOAT16_EXACT_SHARE = 0.8


def assert_greedy_up_to_ties(preset, dtype, served, expected, tolerance):
    """Each served token is the preset's own greedy choice, up to ties.

    Teacher-forces every row's prompt and served tokens through the preset's
    own `dtype` model: at each step the served token's logit must be within
    `tolerance` of the largest, and at least `BFLOAT16_EXACT_SHARE` of all
    served tokens must be the argmax. Rows equal to `generate()`'s are
    counted for the report.
    """
    causal_lm = keras_hub.models.CausalLM.from_preset(preset, dtype=dtype, preprocessor=None)
    gaps, equal_rows = [], 0
    for (prompt_ids, got), (expected_prompt, want) in zip(served, expected, strict=True):
        assert prompt_ids == expected_prompt
        equal_rows += got == want
        context = np.array([prompt_ids + got])
        logits = causal_lm({"token_ids": context, "padding_mask": np.ones_like(context)})
        logits = keras.ops.convert_to_numpy(keras.ops.cast(logits[0], "float32"))
        for step, token in enumerate(got):
            scores = logits[len(prompt_ids) - 1 + step]
            gaps.append(float(scores.max() - scores[token]))
    exact = sum(gap == 0 for gap in gaps) / len(gaps)
    print(
        f"\n{dtype}: {equal_rows} of {len(served)} rows equal generate()'s; "
        f"{exact:.0%} of {len(gaps)} tokens the exact argmax on their own "
        f"context, largest gap to the top logit {max(gaps):.3f}"
    )
    assert max(gaps) <= tolerance, gaps
    assert exact >= BFLOAT16_EXACT_SHARE, gaps


# float32 last: the data-parallel test reuses its engine (only speed).
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_weights_dtype(engines, tiny_presets, dtype):
    expected = oracle_ids(tiny_presets["plain"], dtype)
    llm = engines(f"tiny_{dtype}")
    backbone = served_model(llm).backbone
    assert {v.dtype for v in backbone.weights} == {dtype}
    served = served_ids(llm)
    if dtype == "float32":
        assert served == expected
    else:
        assert_greedy_up_to_ties(tiny_presets["plain"], dtype, served, expected, BFLOAT16_TIE)


# ---------------------------------------------------------------------------
# Data parallel: `vllm serve --data-parallel-size 2`, the spawned layout
# (`vllm.LLM` refuses data_parallel_size > 1 in one process). On a 2-core
# machine both engine cores bind to the same core; slow, but it serves.


def test_data_parallel_matches_one_engine(engines, tiny_presets):
    single = served_ids(engines("tiny_float32"))
    engines.close()  # one engine at a time
    model = f"keras_hub:{tiny_presets['plain']}"
    port = free_port()
    command = serve_command(
        model,
        "--port", str(port),
        "--max-model-len", "256",
        "--dtype", "float32",
        "--data-parallel-size", "2",
        "--api-server-count", "1",
        "--enforce-eager",  # replicas are what is tested, not compiling
    )  # fmt: skip
    with running_server(command, port, model_name=model) as (base_url, _):
        # Concurrent requests, so the load balancer spreads them.
        served = greedy_ids(base_url, model, 2 * TINY_PROMPTS, TINY_TOKENS, concurrent=True)
        per_engine = requests_per_engine(base_url)
    print(f"\ndata parallel 2: requests served per engine {per_engine}")
    assert served == 2 * single
    assert sorted(per_engine) == [0, 1] and all(per_engine.values()), per_engine


# ---------------------------------------------------------------------------
# n-gram speculative decoding, in a spawned engine: the n-gram proposer
# imports numba, after which vLLM 0.32's CPU kernel-override scan at worker
# start (`triton_utils.dispatcher._rebind_kernels`, over every module) fails
# on llvmlite's `ffi.lib`, whose `vars()` is not a dict; any in-process engine
# started later in the same process (the rest of the suite) would fail.

SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)


def test_ngram_speculative_decoding(engines, baseline):
    llm = engines("ngram")
    speculative = llm.llm_engine.vllm_config.speculative_config
    assert speculative is not None and speculative.method == "ngram"
    before = counters(llm, *SPEC_COUNTERS)
    outputs = llm.generate(
        REPETITIVE_PROMPTS, greedy(SPEC_TOKENS, ignore_eos=True), use_tqdm=False
    )
    after = counters(llm, *SPEC_COUNTERS)
    drafts, drafted, accepted = (after[n] - before[n] for n in SPEC_COUNTERS)
    print(
        f"\nngram: {drafts:.0f} drafts, {accepted:.0f} of {drafted:.0f} draft "
        f"tokens accepted ({accepted / max(drafted, 1):.0%})"
    )
    assert token_ids(outputs) == token_ids(baseline["spec"])
    assert accepted > 0
