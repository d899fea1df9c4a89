"""Images through `vllm-keras-hub serve` and the official `openai` client.

A real server process for each family's tiny vision preset (Gemma3, Gemma3n,
Gemma4 with bidirectional image attention, and Qwen3.5 with M-RoPE;
`vision*_test.py` prove the offline engine). The served tokens of a chat
message with a data-URI image equal the oracle's on the prompt the family's
chat format renders: the preset's own `generate()`, or Gemma4's and
Qwen3.5's full forward. Gemma3n's and Gemma4's presets take audio too, as
the published Gemma3n and Gemma4 E2B and E4B do: WAV, FLAC and MP3 clips,
and Gemma3n's transcribes and translates; Gemma4's and Qwen3.5's take
video, as every published one does: an MPEG-4 `video_url`. Bad image,
audio and video requests get a 400 that names the cause, routes a model
does not offer a 404, and the server keeps serving.
"""

import base64
import io
import json

import openai
import pytest

from vllm_keras_hub.testing import audio
from vllm_keras_hub.testing.image_oracle import gemma4_full_forward_with_images
from vllm_keras_hub.testing.image_oracle import keras_hub_greedy_with_images
from vllm_keras_hub.testing.images import IMAGES
from vllm_keras_hub.testing.mrope_oracle import qwen3_5_full_forward_with_images
from vllm_keras_hub.testing.server import free_port
from vllm_keras_hub.testing.server import running_server
from vllm_keras_hub.testing.server import serve_command
from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

MODEL = "tiny-vision"
MAX_TOKENS = 8
# family -> (the prompt its chat format renders for the test's message,
# its preset's options, its oracle).
FAMILIES = {
    "gemma3": (
        "<start_of_turn>user\nWhat is in<start_of_image>this picture?"
        "<end_of_turn>\n<start_of_turn>model\n",
        {},
        keras_hub_greedy_with_images,
    ),
    "gemma3n": (
        "<start_of_turn>user\nWhat is in<start_of_image>this picture?"
        "<end_of_turn>\n<start_of_turn>model\n",
        dict(audio=True),
        keras_hub_greedy_with_images,
    ),
    "gemma4": (
        # Gemma 4's official template closes an empty thought channel.
        "<|turn>user\nWhat is in<|image|>this picture?<turn|>\n"
        "<|turn>model\n<|channel>thought\n<channel|>",
        dict(bidirectional=True, audio=True, video=True),
        gemma4_full_forward_with_images,
    ),
    "qwen3_5": (
        # Qwen3.5's official template keeps text parts as they are, and
        # opens a thought.
        "<|im_start|>user\nWhat is in <|vision_start|><|image_pad|><|vision_end|> "
        "this picture?<|im_end|>\n<|im_start|>assistant\n<think>\n",
        dict(video=True),
        qwen3_5_full_forward_with_images,
    ),
}

# Families whose presets take audio (Gemma3n's, Gemma4's) or video
# (Gemma4's, Qwen3.5's) too, as published.
LIMITS = {
    "gemma3n": {"image": 2, "audio": 1},
    "gemma4": {"image": 2, "audio": 1, "video": 1},
    "qwen3_5": {"image": 2, "video": 1},
}
# The chat format of the families that take audio, for the audio test's
# message (Gemma4's official template writes an audio part as `<|audio|>`).
AUDIO_PROMPTS = {
    "gemma3n": (
        "<start_of_turn>user\nWhat is said in<start_of_audio>this clip?"
        "<end_of_turn>\n<start_of_turn>model\n"
    ),
    "gemma4": (
        "<|turn>user\nWhat is said in<|audio|>this clip?<turn|>\n"
        "<|turn>model\n<|channel>thought\n<channel|>"
    ),
}

# The prompt each family's chat format renders for a system message and a
# user message.
SYSTEM_PROMPTS = {
    "gemma3": "<start_of_turn>user\nBe brief.\n\nHello there<end_of_turn>\n<start_of_turn>model\n",
    "gemma3n": "<start_of_turn>user\nBe brief.\n\nHello there<end_of_turn>\n<start_of_turn>model\n",
    # Gemma 4's official template follows a system text part with a space.
    "gemma4": (
        "<|turn>system\nBe brief. <turn|>\n<|turn>user\nHello there<turn|>\n"
        "<|turn>model\n<|channel>thought\n<channel|>"
    ),
    "qwen3_5": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    ),
}


def data_uri(image, format="PNG"):
    buffer = io.BytesIO()
    image.save(buffer, format=format)
    return f"data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}"


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def preset(tmp_path_factory, family):
    directory = str(tmp_path_factory.mktemp(f"{family}_vision"))
    return build_tiny_vision_preset(directory, family, **FAMILIES[family][1])


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """A folder of images the server may read."""
    folder = tmp_path_factory.mktemp("media")
    IMAGES[0].save(folder / "image.png")
    return folder


@pytest.fixture(scope="module")
def client(preset, media, family):
    port = free_port()
    command = serve_command(
        preset, "--port", str(port), "--served-model-name", MODEL,
        "--max-model-len", "1024", "--dtype", "float32", "--enforce-eager",
        "--limit-mm-per-prompt", json.dumps(LIMITS.get(family, {"image": 2})),
        "--allowed-local-media-path", str(media),
    )  # fmt: skip
    with running_server(command, port, model_name=MODEL) as (base_url, _):
        yield openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def chat(client, content, **kwargs):
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
        **kwargs,
    )


def assert_still_serving(client):
    reply = chat(client, [{"type": "text", "text": "Hello there"}])
    assert len(reply.choices[0].token_ids) == MAX_TOKENS


def test_an_image_url_part_gives_the_tokens_of_the_oracle(client, preset, family):
    content = [
        {"type": "text", "text": "What is in "},
        image_part(data_uri(IMAGES[0])),
        {"type": "text", "text": " this picture?"},
    ]
    reply = chat(client, content)
    # The family's chat format: the image where it stands, text parts trimmed.
    prompt, _, oracle = FAMILIES[family]
    expected = oracle(preset, [(prompt, [IMAGES[0]])], MAX_TOKENS)
    assert reply.prompt_token_ids == expected[0][0]
    assert reply.choices[0].token_ids == expected[0][1]


def test_a_local_file_under_the_allowed_path_gives_the_tokens_of_the_oracle(
    client, preset, family, media
):
    content = [
        {"type": "text", "text": "What is in "},
        image_part(f"file://{media}/image.png"),
        {"type": "text", "text": " this picture?"},
    ]
    reply = chat(client, content)
    prompt, _, oracle = FAMILIES[family]
    expected = oracle(preset, [(prompt, [IMAGES[0]])], MAX_TOKENS)
    assert reply.choices[0].token_ids == expected[0][1]


def test_a_system_message_renders_in_the_family_format(client, preset, family):
    """vLLM hands a template that takes parts every message's content as
    parts, the system message's too."""
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello there"},
        ],
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    prompt = SYSTEM_PROMPTS[family]
    expected = FAMILIES[family][2](preset, [(prompt, [])], MAX_TOKENS)
    assert reply.prompt_token_ids == expected[0][0]
    assert reply.choices[0].token_ids == expected[0][1]


def test_an_invalid_image_is_a_400(client):
    broken = "data:image/png;base64," + base64.b64encode(b"not an image").decode()
    with pytest.raises(openai.BadRequestError, match="Failed to load image"):
        chat(client, [image_part(broken), {"type": "text", "text": "what?"}])
    assert_still_serving(client)


def test_too_many_images_is_a_400(client):
    parts = [image_part(data_uri(image)) for image in IMAGES]
    with pytest.raises(openai.BadRequestError, match="At most 2 image"):
        chat(client, [*parts, {"type": "text", "text": "compare them"}])
    assert_still_serving(client)


def audio_parts():
    """One clip as a WAV `input_audio` part, and as FLAC and MP3 `audio_url`
    data URIs at 22.05 kHz (vLLM resamples them)."""
    wav = audio.encoded(audio.tone_clip(440), "wav")
    other = audio.tone_clip(440, rate=22050)
    parts = [
        (wav, {"type": "input_audio", "input_audio": {"data": b64(wav), "format": "wav"}})
    ]
    for fmt in ("flac", "mp3"):
        data = audio.encoded(other, fmt, rate=22050)
        url = f"data:audio/{fmt};base64,{b64(data)}"
        parts.append((data, {"type": "audio_url", "audio_url": {"url": url}}))
    return parts


def b64(data):
    return base64.b64encode(data).decode()


def test_audio_parts(client, preset, family):
    """Gemma3n: WAV, FLAC and MP3 clips give the oracle's tokens on the
    samples vLLM decodes; Gemma4: a WAV `input_audio` part does (its clips
    attend causally beside its bidirectional images; the file formats are
    vLLM's decoding, the same for both). The others take no audio: a 400
    that says so."""
    parts = audio_parts()[:1] if family == "gemma4" else audio_parts()
    replies, prompts = [], []
    for data, part in parts:
        content = [
            {"type": "text", "text": "What is said in "},
            part,
            {"type": "text", "text": " this clip?"},
        ]
        if family not in AUDIO_PROMPTS:
            with pytest.raises(openai.BadRequestError, match="images( and video)?, not audio"):
                chat(client, content)
            continue
        replies.append(chat(client, content))
        clip = audio.decoded(data)
        if part["type"] == "input_audio":
            # The WAV file's own samples: at 16 kHz, only quantised to 16 bits.
            assert abs(clip - audio.tone_clip(440)).max() < 2.0**-14
        prompts.append((AUDIO_PROMPTS[family], [], [clip]))
    if prompts:
        expected = FAMILIES[family][2](preset, prompts, MAX_TOKENS)
        for reply, (prompt_ids, generated_ids) in zip(replies, expected, strict=True):
            assert reply.prompt_token_ids == prompt_ids
            assert reply.choices[0].token_ids == generated_ids
    assert_still_serving(client)


# The prompts Gemma3n's speech-to-text fixes (`models/audio.py`), the
# second for a translation from German into English.
TRANSCRIBE_PROMPT = (
    "<start_of_turn>user\nTranscribe this audio: <start_of_audio><end_of_turn>\n"
    "<start_of_turn>model\n"
)
TRANSLATE_PROMPT = (
    "<start_of_turn>user\nTranslate this audio from German into English: "
    "<start_of_audio><end_of_turn>\n<start_of_turn>model\n"
)


def assert_not_routed(client, create, request):
    """vLLM routes speech-to-text only for a model that supports it
    (`register_speech_to_text_api_routers`): a 404 from the router, not
    from a model lookup, and the server serves on."""
    with pytest.raises(openai.NotFoundError) as raised:
        create(**request)
    assert raised.value.status_code == 404
    assert raised.value.response.json() == {"detail": "Not Found"}
    assert_still_serving(client)


def text_to_first_stop(preset, tokens):
    """The text of `tokens` up to the first stop token, as vLLM stops."""
    import keras_hub

    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    stops = {tokenizer.end_token_id, tokenizer.token_to_id("<end_of_turn>")}
    kept = []
    for token in tokens:
        if token in stops:
            break
        kept.append(token)
    assert len(kept) > 1
    return tokenizer.detokenize(kept)


def test_a_transcription(client, preset, family):
    """Gemma3n: `/v1/audio/transcriptions` answers with the text of the
    oracle's tokens on vLLM's fixed transcription prompt, to the first
    stop token. The others offer no transcription: a 404."""
    wav = audio.encoded(audio.tone_clip(550), "wav")
    request = dict(model=MODEL, file=("clip.wav", wav), temperature=0.0)
    if family != "gemma3n":
        assert_not_routed(client, client.audio.transcriptions.create, request)
        return
    reply = client.audio.transcriptions.create(
        **request, extra_body={"max_completion_tokens": MAX_TOKENS}
    )
    expected = keras_hub_greedy_with_images(
        preset, [(TRANSCRIBE_PROMPT, [], [audio.decoded(wav)])], MAX_TOKENS
    )[0][1]
    assert reply.text == text_to_first_stop(preset, expected)


def test_a_translation(client, preset, family):
    """Gemma3n: `/v1/audio/translations` from German into English answers
    with the text of the oracle's tokens on the translation prompt its
    languages name, to the first stop token. The others offer no
    translation: a 404."""
    wav = audio.encoded(audio.tone_clip(550), "wav")
    request = dict(model=MODEL, file=("clip.wav", wav), temperature=0.0)
    if family != "gemma3n":
        assert_not_routed(client, client.audio.translations.create, request)
        return
    reply = client.audio.translations.create(
        **request,
        extra_body={"language": "de", "to_language": "en", "max_completion_tokens": MAX_TOKENS},
    )
    expected = keras_hub_greedy_with_images(
        preset, [(TRANSLATE_PROMPT, [], [audio.decoded(wav)])], MAX_TOKENS
    )[0][1]
    assert reply.text == text_to_first_stop(preset, expected)


def test_an_undecodable_clip_is_a_400(client, family):
    part = {"type": "input_audio", "input_audio": {"data": b64(b"not audio"), "format": "wav"}}
    with pytest.raises(openai.BadRequestError):
        chat(client, [part, {"type": "text", "text": "what is said?"}])
    assert_still_serving(client)


# The official templates, for the video test's message, the frames vLLM's
# loader keeps (as `serve` sets it: the converter's, or for Qwen3.5, which
# takes all it is given, vLLM's default) and the oracle.
VIDEO_CASES = {
    "gemma4": (
        "<|turn>user\nWhat happens in<|video|>this video?<turn|>\n"
        "<|turn>model\n<|channel>thought\n<channel|>",
        4,
        gemma4_full_forward_with_images,
    ),
    "qwen3_5": (
        "<|im_start|>user\nWhat happens in <|vision_start|><|video_pad|><|vision_end|> "
        "this video?<|im_end|>\n<|im_start|>assistant\n<think>\n",
        32,
        qwen3_5_full_forward_with_images,
    ),
}


def test_a_video_url_part(client, preset, family):
    """Gemma4: an MPEG-4 file of 10 frames as a data URI gives the oracle's
    tokens on the 4 frames vLLM's loader keeps of it (`serve` sets the
    converter's count). (This file's frames give the same tokens causal or
    not: `vision_gemma4_bidirectional_test.py` shows their bidirectional
    attention.) Qwen3.5: on all 10, in 5 timestamped pairs. The others take
    no video: a 400 that says so. An undecodable file is a 400."""
    from vllm_keras_hub.testing import videos

    data = videos.encoded(videos.random_video(6, frames=10), fps=2)
    part = {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{b64(data)}"}}
    content = [
        {"type": "text", "text": "What happens in "},
        part,
        {"type": "text", "text": " this video?"},
    ]
    if family not in VIDEO_CASES:
        with pytest.raises(openai.BadRequestError, match="not video"):
            chat(client, content)
        assert_still_serving(client)
        return
    reply = chat(client, content)
    prompt, num_frames, oracle = VIDEO_CASES[family]
    decoded = videos.decoded(data, num_frames=num_frames)
    assert len(decoded.frames) == min(num_frames, 10)
    expected = oracle(preset, [(prompt, decoded)], MAX_TOKENS)
    assert reply.prompt_token_ids == expected[0][0]
    assert reply.choices[0].token_ids == expected[0][1]
    broken = {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{b64(b'no')}"}}
    with pytest.raises(openai.BadRequestError):
        chat(client, [broken, {"type": "text", "text": "what happens?"}])
    assert_still_serving(client)
