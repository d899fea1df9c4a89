"""Images through `vllm-keras-hub serve` and the official `openai` client.

A real server process with a tiny Gemma3 vision preset (`vision_test.py`
proves the offline engine against `generate()`); the served tokens of a
chat message with a data-URI image equal the preset's own `generate()` on
the prompt Gemma3's chat format renders. Bad image requests get a 400 that
names the cause, and the server keeps serving.
"""

import base64
import io
import wave

import openai
import pytest

from vllm_keras_hub.testing.media_encoders import build_tiny_vision_preset
from vllm_keras_hub.testing.oracle import keras_hub_greedy_with_images
from vllm_keras_hub.testing.server import free_port
from vllm_keras_hub.testing.server import running_server
from vllm_keras_hub.testing.server import serve_command
from vllm_keras_hub.vision_test import IMAGES

MODEL = "tiny-gemma3-vision"
MAX_TOKENS = 8


def data_uri(image, format="PNG"):
    buffer = io.BytesIO()
    image.save(buffer, format=format)
    return f"data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}"


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return build_tiny_vision_preset(str(tmp_path_factory.mktemp("gemma3_vision")))


@pytest.fixture(scope="module")
def client(preset):
    port = free_port()
    command = serve_command(
        preset, "--port", str(port), "--served-model-name", MODEL,
        "--max-model-len", "256", "--dtype", "float32", "--enforce-eager",
        "--limit-mm-per-prompt", '{"image": 2}',
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


def test_an_image_url_part_gives_the_tokens_of_generate(client, preset):
    content = [
        {"type": "text", "text": "What is in "},
        image_part(data_uri(IMAGES[0])),
        {"type": "text", "text": " this picture?"},
    ]
    reply = chat(client, content)
    # Gemma3's chat format: the image where it stands, text parts trimmed.
    prompt = (
        "<start_of_turn>user\nWhat is in<start_of_image>this picture?"
        "<end_of_turn>\n<start_of_turn>model\n"
    )
    expected = keras_hub_greedy_with_images(preset, [(prompt, [IMAGES[0]])], MAX_TOKENS)
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


def test_audio_is_a_400(client):
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(16000)
        audio.writeframes(b"\0\0" * 1600)
    data = base64.b64encode(buffer.getvalue()).decode()
    part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    with pytest.raises(openai.BadRequestError, match="takes images, not audio"):
        chat(client, [part, {"type": "text", "text": "what is said?"}])
    assert_still_serving(client)
