"""KerasHub `Seq2SeqLM` presets served by vLLM's encoder-decoder runner.

A tiny random-weight BART (`testing/seq2seq.py`), saved with its
preprocessor as published presets are, served compiled; a transformers
checkpoint of the same shape eagerly. The oracle is the preset's own
greedy decoding: its preprocessor's `generate_preprocess` and its task's
`generate_step` (`keras_hub_greedy`), since `generate()` itself needs
TensorFlow to strip its output (a test below shows it).
"""

import pytest
from vllm import SamplingParams

from tests.model_test import compilations
from vllm_keras_hub import settings
from vllm_keras_hub.entrypoints.llm import KerasHubLLM
from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS

from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.seq2seq import build_tiny_bart
from vllm_keras_hub.testing.seq2seq import keras_hub_greedy

# 3 to 41 encoder tokens with the start and end tokens (measured).
TEXTS = [
    "hello",
    "the quick brown fox jumps over the lazy dog",
    "def main(): return 0 and more words here to make it longer than the rest",
    "mars is red",
]
NEW_TOKENS = 20
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)


def explicit(text, decoder_text=""):
    return {
        "encoder_prompt": {"prompt": "", "multi_modal_data": {"text": text}},
        "decoder_prompt": decoder_text,
    }


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return build_tiny_bart(str(tmp_path_factory.mktemp("bart")))


@pytest.fixture(scope="module")
def oracle(preset):
    return keras_hub_greedy(preset, TEXTS, NEW_TOKENS)


@pytest.fixture(scope="module")
def compiled_llm(preset):
    """Compiled: vLLM runs a step with encoder inputs eagerly, and the
    decoder's other steps compiled."""
    before = compilations()
    with in_process_llm(f"keras_hub:{preset}", max_model_len=128, enforce_eager=False) as llm:
        yield llm, compilations() - before


@pytest.fixture(scope="module")
def llm(compiled_llm):
    return compiled_llm[0]


def tokens(outputs):
    return [(list(o.prompt_token_ids), list(o.outputs[0].token_ids)) for o in outputs]


def test_the_oracle_sees_each_text(oracle):
    prompts, outputs = oracle
    assert all(prompt == [prompts[0][0], prompts[0][1]] for prompt in prompts)
    assert len({tuple(output) for output in outputs}) == len(TEXTS)
    assert all(len(set(output)) > 1 for output in outputs)


def test_greedy_tokens_are_the_presets_own(llm, oracle):
    served = tokens(llm.generate([explicit(text) for text in TEXTS], GREEDY))
    assert served == list(zip(*oracle))


def test_plain_prompts_are_encoder_texts(llm, oracle):
    """`generate("text")` encodes the text, as `Seq2SeqLM.generate` does."""
    assert tokens(llm.generate(TEXTS, GREEDY)) == list(zip(*oracle))


def test_each_text_alone_equals_it_in_the_batch(llm, oracle):
    for index in (0, 2):
        alone = tokens(llm.generate([explicit(TEXTS[index])], GREEDY))
        assert alone == [(oracle[0][index], oracle[1][index])]


def test_a_request_joins_while_another_decodes(llm, oracle):
    """A step with one request's encoder input and another's decode: the
    cross-attention writes the new request's keys and values and reads the
    other's from the cache."""
    engine = llm.llm_engine
    done, progress = {}, {}
    # Numbers, as `LLM.generate` numbers its own requests and sorts by them.
    first, second = "9001", "9002"

    def step():
        for output in engine.step():
            progress[output.request_id] = len(output.outputs[0].token_ids)
            if output.finished:
                done[output.request_id] = (
                    list(output.prompt_token_ids), list(output.outputs[0].token_ids)
                )

    # A fresh one: `LLM.generate` sets its params to report finished
    # requests only, and each step's progress is read here.
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)
    engine.add_request(first, explicit(TEXTS[1]), params)
    try:
        while progress.get(first, 0) < 5:
            step()
        assert progress[first] < NEW_TOKENS
        engine.add_request(second, explicit(TEXTS[2]), params)
        while engine.has_unfinished_requests():
            step()
    finally:
        engine.abort_request([first, second])
    assert done == {
        first: (oracle[0][1], oracle[1][1]),
        second: (oracle[0][2], oracle[1][2]),
    }


def test_a_decoder_prompt_continues_as_the_presets(llm, preset):
    decoder_texts = ["the fox", "hello world"]
    encoder_texts = TEXTS[1:3]
    expected = keras_hub_greedy(preset, encoder_texts, NEW_TOKENS, decoder_texts)
    served = llm.generate(
        [explicit(t, d) for t, d in zip(encoder_texts, decoder_texts)], GREEDY
    )
    assert tokens(served) == list(zip(*expected))
    assert all(len(prompt) > 3 for prompt in expected[0])


def test_vllm_runs_it_as_an_encoder_decoder(compiled_llm):
    llm, compiled = compiled_llm
    config = llm.llm_engine.vllm_config
    assert not config.model_config.enforce_eager and compiled > 0
    assert config.model_config.is_encoder_decoder
    # vLLM turns these off for encoder-decoder models.
    assert not config.scheduler_config.enable_chunked_prefill
    assert not config.cache_config.enable_prefix_caching


def test_the_default_sampling_is_the_presets_own_sampler(llm):
    """Without `SamplingParams`, as `compile()`'s default sampler (top-k)."""
    import keras_hub

    from vllm_keras_hub.export import sampling

    own = sampling.sampling_kwargs(sampling.default_sampler(keras_hub.models.BartSeq2SeqLM))
    assert own["top_k"] > 1 and own["temperature"] > 0
    default = llm.get_default_sampling_params()
    assert (default.top_k, default.temperature) == (own["top_k"], own["temperature"])


def test_bad_encoder_texts_are_refused_and_serving_goes_on(llm, oracle):
    with pytest.raises(ValueError, match="over the 1024 this preset's encoder takes"):
        llm.generate([explicit("word " * 1100)], GREEDY)
    # Empty, as the encoder's own item or as a plain prompt: either would
    # reach the decoder with no encoder input.
    for empty in (explicit(""), explicit([]), ""):
        with pytest.raises(ValueError, match="encoder text is empty"):
            llm.generate([empty], GREEDY)
    assert tokens(llm.generate([explicit(TEXTS[0])], GREEDY)) == [(oracle[0][0], oracle[1][0])]


def test_generate_needs_tensorflow_so_the_oracle_stops_before_it(preset):
    import keras_hub

    seq2seq = keras_hub.models.Seq2SeqLM.from_preset(preset)
    with pytest.raises(ImportError, match="strip_to_ragged requires `tensorflow`"):
        seq2seq.generate(TEXTS[:1], max_length=8)


@pytest.mark.parametrize(
    "setting",
    [
        dict(tensor_parallel_size=2),
        dict(pipeline_parallel_size=2),
        dict(enable_lora=True),
        dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                 "prompt_lookup_max": 2}),
        dict(enable_prompt_embeds=True),
    ],
)
def test_settings_it_is_not_proven_with_are_refused_before_the_engine(preset, setting):
    with pytest.raises(settings.UnsupportedPoolingSettingError, match="BartSeq2SeqLM presets"):
        KerasHubLLM(f"keras_hub:{preset}", **{**TEST_ENGINE_KWARGS, **setting})


def test_completions_through_the_server(preset, oracle):
    """`vllm-keras-hub serve` as a user runs it, with the official `openai`
    client: each completion's prompt is the encoder's text."""
    import openai

    from vllm_keras_hub.testing.server import free_port
    from vllm_keras_hub.testing.server import running_server
    from vllm_keras_hub.testing.server import serve_command

    port = free_port()
    command = serve_command(
        preset, "--port", str(port), "--served-model-name", "tiny",
        "--dtype", "float32", "--enforce-eager",
    )  # fmt: skip
    with running_server(command, port, model_name="tiny") as (base_url, _):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)

        def complete(text):
            choice = client.completions.create(
                model="tiny", prompt=text, max_tokens=NEW_TOKENS, temperature=0,
                extra_body={"return_token_ids": True},
            ).choices[0]  # fmt: skip
            return list(choice.prompt_token_ids), list(choice.token_ids)

        assert [complete(text) for text in TEXTS] == list(zip(*oracle))
        # An encoder text over the encoder's positions: a 400 naming the
        # limit, and the server keeps serving.
        with pytest.raises(openai.BadRequestError, match="maximum context length is 1024 tokens"):
            complete("word " * 1100)
        assert complete(TEXTS[0]) == (oracle[0][0], oracle[1][0])


def test_a_transformers_checkpoint_serves_as_transformers_generates(tmp_path):
    """A transformers BART folder, loaded by keras-hub's converter (which
    drops the first two rows of BART's offset position tables), gives
    transformers' own greedy tokens: vLLM 0.32 has no BART of its own."""
    import transformers

    from vllm_keras_hub.testing.seq2seq import save_hf_bart
    from vllm_keras_hub.testing.seq2seq import transformers_greedy

    folder = str(tmp_path / "hf_bart")
    model = save_hf_bart(folder)
    tokenizer = transformers.BartTokenizer.from_pretrained(folder)
    decoder_prompt = [model.config.decoder_start_token_id, model.config.bos_token_id]
    expected = transformers_greedy(
        model, [tokenizer(text)["input_ids"] for text in TEXTS], decoder_prompt, NEW_TOKENS
    )
    assert len({tuple(output) for output in expected}) == len(TEXTS)
    with in_process_llm(f"keras_hub:{folder}", max_model_len=128) as llm:
        served = tokens(llm.generate(TEXTS, GREEDY))
    assert served == [(decoder_prompt, output) for output in expected]


def test_t5_is_refused_with_its_reason(tmp_path):
    """T5's relative position bias has no vLLM kernel input: a T5 preset is
    refused before anything is built, naming it."""
    import keras_hub

    from vllm_keras_hub import families
    from vllm_keras_hub.export import model_folder

    backbone = keras_hub.models.T5Backbone(
        vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=32, intermediate_dim=64
    )
    backbone.save_to_preset(str(tmp_path))
    with pytest.raises(families.UnsupportedFamilyError, match="relative position bias"):
        model_folder.ModelFolder(str(tmp_path))


def test_an_exported_folder_serves_with_plain_vllm(preset, oracle, tmp_path):
    """`vllm-keras-hub export`, then the plain vLLM server command it prints
    (our plugin registers the model class, processor and renderer)."""
    import shlex
    import subprocess
    import sys

    import openai

    from vllm_keras_hub.testing.server import console_script
    from vllm_keras_hub.testing.server import free_port
    from vllm_keras_hub.testing.server import running_server
    from vllm_keras_hub.testing.user_env import user_env

    folder = str(tmp_path / "folder")
    exported = subprocess.run(
        [console_script(), "export", f"keras_hub:{preset}", folder],
        capture_output=True, text=True, env=user_env(), timeout=300,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    (printed,) = [line for line in exported.stdout.splitlines() if "api_server" in line]
    assert "--tokenizer-mode keras_hub_seq2seq" in printed
    port = free_port()
    command = [
        sys.executable, *shlex.split(printed)[1:],
        "--port", str(port), "--enforce-eager", "--dtype", "float32",
    ]  # fmt: skip
    with running_server(command, port, model_name=folder) as (base_url, _):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        served = [
            client.completions.create(
                model=folder, prompt=text, max_tokens=NEW_TOKENS, temperature=0,
                extra_body={"return_token_ids": True},
            ).choices[0]
            for text in TEXTS
        ]  # fmt: skip
    assert [(list(c.prompt_token_ids), list(c.token_ids)) for c in served] == list(zip(*oracle))
