"""KerasHub `AudioToText` presets (Moonshine) served by vLLM's encoder-decoder runner.

A tiny random-weight Moonshine (`testing/audio_to_text.py`), saved with its
preprocessor and audio converter as published presets are, with heads 36
wide as `moonshine_tiny_en`'s (vLLM's CPU kernel runs them padded to 64),
served compiled. The oracle is the preset's own greedy decoding of each
clip alone: its preprocessor's `generate_preprocess` and its task's
`generate_step` (`keras_hub_greedy`). vLLM has no Moonshine of its own to
cross-check against, and keras-hub no converter from transformers' one.
"""

import numpy as np
import pytest
from vllm import SamplingParams

from tests.model_test import compilations
from vllm_keras_hub import settings
from vllm_keras_hub.entrypoints.llm import KerasHubLLM
from vllm_keras_hub.testing.audio_to_text import SAMPLING_RATE
from vllm_keras_hub.testing.audio_to_text import build_tiny_moonshine
from vllm_keras_hub.testing.audio_to_text import clip
from vllm_keras_hub.testing.audio_to_text import keras_hub_greedy
from vllm_keras_hub.testing.audio_to_text import wav_bytes
from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model

# 0.5 to 2.3 s: 19 to 92 encoder frames (measured by `encoder_frames`).
CLIPS = [clip(seconds, seed) for seed, seconds in enumerate((0.5, 1.0, 1.7, 2.3))]
NEW_TOKENS = 20
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)


def request(samples, decoder_text=None):
    encoder = {"prompt": "", "multi_modal_data": {"audio": (samples, SAMPLING_RATE)}}
    if decoder_text is None:
        return encoder
    return {"encoder_prompt": encoder, "decoder_prompt": decoder_text}


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return build_tiny_moonshine(str(tmp_path_factory.mktemp("moonshine")))


@pytest.fixture(scope="module")
def oracle(preset):
    return keras_hub_greedy(preset, CLIPS, NEW_TOKENS)


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


def test_the_oracle_hears_each_clip(oracle):
    prompts, outputs = oracle
    assert len({tuple(output) for output in outputs}) == len(CLIPS)
    assert all(len(set(output)) > 1 for output in outputs)


def test_greedy_tokens_are_the_presets_own(llm, oracle):
    """Four clips of different lengths in one batch."""
    assert tokens(llm.generate([request(c) for c in CLIPS], GREEDY)) == list(zip(*oracle))


def test_each_clip_alone_equals_it_in_the_batch(llm, oracle):
    for index in (0, 3):
        alone = tokens(llm.generate([request(CLIPS[index])], GREEDY))
        assert alone == [(oracle[0][index], oracle[1][index])]


def test_a_request_joins_while_another_decodes(llm, oracle):
    """A step with one clip's encoder input and another's decode: the
    cross-attention writes the new clip's keys and values and reads the
    other's from the cache."""
    engine = llm.llm_engine
    done, progress = {}, {}
    first, second = "9101", "9102"

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
    engine.add_request(first, request(CLIPS[2]), params)
    try:
        while progress.get(first, 0) < 5:
            step()
        assert progress[first] < NEW_TOKENS
        engine.add_request(second, request(CLIPS[1]), params)
        while engine.has_unfinished_requests():
            step()
    finally:
        engine.abort_request([first, second])
    assert done == {
        first: (oracle[0][2], oracle[1][2]),
        second: (oracle[0][1], oracle[1][1]),
    }


def test_a_prompt_text_continues_as_the_presets(llm, preset):
    texts = ["the fox", "hello world"]
    expected = keras_hub_greedy(preset, CLIPS[1:3], NEW_TOKENS, texts)
    served = llm.generate([request(c, t) for c, t in zip(CLIPS[1:3], texts)], GREEDY)
    assert tokens(served) == list(zip(*expected))
    assert all(len(prompt) > 2 for prompt in expected[0])


def test_vllm_runs_it_as_an_encoder_decoder_with_padded_heads(compiled_llm):
    llm, compiled = compiled_llm
    config = llm.llm_engine.vllm_config
    assert not config.model_config.enforce_eager and compiled > 0
    assert config.model_config.is_encoder_decoder
    # vLLM turns these off for encoder-decoder models.
    assert not config.scheduler_config.enable_chunked_prefill
    assert not config.cache_config.enable_prefix_caching
    # The preset's 36-wide heads, on the CPU kernel's 64-wide ones.
    model = served_model(llm)
    layer = model.backbone.decoder_blocks[0].self_attention
    assert layer._key_dim == 36
    assert {a.head_size for a in [*model.self_attention, *model.cross_attention]} == {64}


def test_the_oracle_runs_each_clip_alone_and_packs_two_start_tokens(preset, oracle):
    """keras-hub's `generate_preprocess` packs a clip without text as
    `<s> <s>` (its start token, then its packer's), which the served
    decoder prompt follows; and a batch pads its clips with zeros, which
    the encoder's group norm sees, so a clip's tokens in a keras-hub batch
    are not its own alone."""
    import keras_hub
    import torch

    assert oracle[0] == [[1, 1]] * len(CLIPS)
    task = keras_hub.models.MoonshineAudioToText.from_preset(preset, dtype="float32")
    padded = np.zeros((2, len(CLIPS[3])), "float32")
    padded[0, : len(CLIPS[0])], padded[1] = CLIPS[0], CLIPS[3]
    with torch.no_grad():
        inputs = task.preprocessor.generate_preprocess({"audio": padded})
        batched = task.call_encoder(inputs["encoder_input_values"], inputs["encoder_padding_mask"])[0]
        alone = task.call_encoder(
            inputs["encoder_input_values"][:1, : len(CLIPS[0])],
            inputs["encoder_padding_mask"][:1, : len(CLIPS[0])],
        )[0]
    frames = alone.shape[1]
    assert not np.allclose(np.asarray(batched[0, :frames]), np.asarray(alone[0]), atol=1e-3)


def test_bad_input_is_refused_and_serving_goes_on(llm, oracle):
    with pytest.raises(ValueError, match=r"0\.050 s long; this preset transcribes clips of 0\.1"):
        llm.generate([request(clip(0.05, 9))], GREEDY)
    with pytest.raises(ValueError, match=r"65\.000 s long.*split longer audio"):
        llm.generate([request(np.full(65 * SAMPLING_RATE, 0.1, "float32"))], GREEDY)
    with pytest.raises(ValueError, match="transcribes a clip"):
        llm.generate(["no audio here"], GREEDY)
    assert tokens(llm.generate([request(CLIPS[0])], GREEDY)) == [(oracle[0][0], oracle[1][0])]


@pytest.mark.parametrize(
    "setting",
    [dict(tensor_parallel_size=2), dict(enable_lora=True), dict(enable_prompt_embeds=True)],
)
def test_settings_it_is_not_proven_with_are_refused_before_the_engine(preset, setting):
    with pytest.raises(
        settings.UnsupportedPoolingSettingError, match="MoonshineAudioToText presets"
    ):
        KerasHubLLM(f"keras_hub:{preset}", **{**TEST_ENGINE_KWARGS, **setting})


def _transcribe_and_refuse(client, model, preset):
    """Transcriptions with the official `openai` client: each equal to the
    preset's own transcript of the WAV's samples; bad requests get a 400,
    and serving goes on."""
    import keras_hub
    import openai

    files = [wav_bytes(samples) for samples in CLIPS[:3]]
    _, expected = keras_hub_greedy(preset, [samples for _, samples in files], NEW_TOKENS)
    # Its task's: `MoonshineTokenizer.from_preset` finds no tokenizer class
    # for a Moonshine backbone (keras-hub's bug, `export/preset_folder.py`).
    tokenizer = keras_hub.models.MoonshineAudioToText.from_preset(
        preset, dtype="float32"
    ).preprocessor.tokenizer

    def transcript(ids):
        return tokenizer.detokenize([i for i in ids if i != tokenizer.end_token_id])

    def transcribe(data, **kwargs):
        return client.audio.transcriptions.create(
            model=model, file=("clip.wav", data, "audio/wav"), temperature=0,
            extra_body={"max_completion_tokens": NEW_TOKENS}, **kwargs,
        ).text  # fmt: skip

    served = [transcribe(data, language="en") for data, _ in files]
    assert served == [transcript(ids) for ids in expected]
    assert len(set(served)) == len(files)
    for data, match in (
        (b"not audio at all", "Invalid or unsupported audio"),
        (wav_bytes(np.full(65 * SAMPLING_RATE, 0.1, "float32"))[0], "split longer audio"),
    ):
        with pytest.raises(openai.BadRequestError, match=match):
            transcribe(data)
    with pytest.raises(openai.BadRequestError, match="transcribes English only"):
        transcribe(files[0][0], language="fr")
    assert transcribe(files[0][0]) == served[0]


def test_transcriptions_through_the_server(preset):
    """`vllm-keras-hub serve` as a user runs it: `/v1/audio/transcriptions`."""
    import openai

    from vllm_keras_hub.testing.server import free_port
    from vllm_keras_hub.testing.server import running_server
    from vllm_keras_hub.testing.server import serve_command

    port = free_port()
    command = serve_command(
        preset, "--port", str(port), "--served-model-name", "tiny",
        "--dtype", "float32", "--enforce-eager", "--max-model-len", "128",
    )  # fmt: skip
    with running_server(command, port, model_name="tiny") as (base_url, _):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        _transcribe_and_refuse(client, "tiny", preset)


def test_an_exported_folder_transcribes_with_plain_vllm(preset, tmp_path):
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
    assert "--tokenizer-mode keras_hub_audio_to_text" in printed
    assert "--max-num-batched-tokens 2665" in printed
    port = free_port()
    command = [
        sys.executable, *shlex.split(printed)[1:],
        "--port", str(port), "--enforce-eager", "--dtype", "float32", "--max-model-len", "128",
    ]  # fmt: skip
    with running_server(command, port, model_name=folder) as (base_url, _):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        _transcribe_and_refuse(client, folder, preset)
