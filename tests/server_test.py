"""`vllm-keras-hub serve` (the default model, SmolLM2-135M-Instruct) end to end.

A real server process on a free loopback port, started as users start it
(compiled, with an API key), spoken to with the official `openai` client.
"""

import base64
import io
import json
import urllib.error
import urllib.request

import openai
import pytest
from PIL import Image

from vllm_keras_hub.smollm2 import DEFAULT_MODEL_NAME
from vllm_keras_hub.testing.server import DEFAULT_SERVER_API_KEY

MAX_MODEL_LEN = 512

API_KEY = DEFAULT_SERVER_API_KEY


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


@pytest.fixture(scope="module")
def client(server):
    base_url, _ = server
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=API_KEY, max_retries=0)


def post(base_url, path, body, key=API_KEY):
    """A raw POST; returns (status, parsed JSON body)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{base_url}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def assert_still_serving(client):
    completion = client.completions.create(
        model=DEFAULT_MODEL_NAME, prompt="The capital of France is", max_tokens=4, temperature=0
    )
    assert "Paris" in completion.choices[0].text


def test_models_health_and_metrics(server, client):
    base_url, _ = server
    assert [m.id for m in client.models.list().data] == [DEFAULT_MODEL_NAME]
    with urllib.request.urlopen(f"{base_url}/health") as response:
        assert response.status == 200
    with urllib.request.urlopen(f"{base_url}/metrics") as response:
        assert "vllm:num_requests_running" in response.read().decode()


def test_api_key_is_required(server):
    base_url, _ = server
    body = {"model": DEFAULT_MODEL_NAME, "prompt": "Hi", "max_tokens": 1}
    assert post(base_url, "/v1/completions", body, key=None)[0] == 401
    assert post(base_url, "/v1/completions", body, key="wrong")[0] == 401
    assert post(base_url, "/v1/completions", body)[0] == 200


def test_completion(client):
    assert_still_serving(client)


def test_chat_uses_the_presets_chatml_template(client):
    chat = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        temperature=0,
    )
    choice = chat.choices[0]
    assert "Paris" in choice.message.content
    assert "<|im_end|>" not in choice.message.content
    assert choice.finish_reason in ("stop", "length")


def test_streamed_chat_joins_into_the_same_text(client):
    request = dict(
        model=DEFAULT_MODEL_NAME,
        messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=20,
        temperature=0,
    )
    whole = client.chat.completions.create(**request).choices[0].message.content
    chunks = client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}
    )
    pieces, usage = [], None
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert len(pieces) > 1
    assert "".join(pieces) == whole
    assert usage is not None and usage.completion_tokens > 0


def test_stop_strings(client):
    completion = client.completions.create(
        model=DEFAULT_MODEL_NAME,
        prompt="The capital of France is",
        max_tokens=20,
        temperature=0,
        stop=["."],
    )
    choice = completion.choices[0]
    assert "Paris" in choice.text and "." not in choice.text
    assert choice.finish_reason == "stop"


def test_n_and_seed(client):
    request = dict(
        model=DEFAULT_MODEL_NAME,
        prompt="Once upon a time",
        max_tokens=12,
        temperature=1.0,
        n=2,
        seed=1234,
    )
    first = client.completions.create(**request)
    again = client.completions.create(**request)
    assert len(first.choices) == 2
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    other = client.completions.create(**{**request, "seed": 99})
    assert [c.text for c in other.choices] != [c.text for c in first.choices]


def test_prompt_longer_than_max_model_len_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(
            model=DEFAULT_MODEL_NAME, prompt="hello " * (2 * MAX_MODEL_LEN), max_tokens=4
        )
    assert_still_serving(client)


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "smollm2-135m-instruct", "prompt": "Hi", ',
        {"model": DEFAULT_MODEL_NAME, "prompt": "Hi", "max_tokens": -1},
        {"model": DEFAULT_MODEL_NAME, "prompt": "Hi", "temperature": -0.5},
    ],
    ids=["malformed-json", "negative-max-tokens", "negative-temperature"],
)
def test_bad_requests_are_400s_and_the_server_keeps_serving(server, client, body):
    base_url, _ = server
    status, error = post(base_url, "/v1/completions", body)
    assert status == 400, error
    assert error["error"]["message"]
    assert_still_serving(client)


def test_an_image_for_a_text_only_preset_is_a_400(client):
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PNG")
    png = base64.b64encode(buffer.getvalue()).decode()
    content = [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
        {"type": "text", "text": "What is this?"},
    ]
    with pytest.raises(openai.BadRequestError, match="is not a multimodal model"):
        client.chat.completions.create(
            model=DEFAULT_MODEL_NAME,
            messages=[{"role": "user", "content": content}],
            max_tokens=4,
        )
    assert_still_serving(client)
