"""PaliGemma through `vllm-keras-hub serve` and the official `openai` client.

A real server process for the tiny PaliGemma preset
(`vision_pali_gemma_test.py` proves the offline engine). A chat message
with an image gives the tokens of the preset's own `generate()` on the
message's text and a newline, the image first; a message without an image,
or a conversation of more than one message, gets a 400 naming the cause,
and the server keeps serving.
"""

import openai
import pytest

from vllm_keras_hub.testing.image_oracle import pali_gemma_greedy
from vllm_keras_hub.testing.images import IMAGES
from vllm_keras_hub.testing.images import image_data_url
from vllm_keras_hub.testing.server import free_port
from vllm_keras_hub.testing.server import running_server
from vllm_keras_hub.testing.server import serve_command
from vllm_keras_hub.testing.vision_presets import build_tiny_pali_gemma_preset

MODEL = "tiny-pali-gemma"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return build_tiny_pali_gemma_preset(str(tmp_path_factory.mktemp("pali_gemma")))


@pytest.fixture(scope="module")
def client(preset):
    port = free_port()
    command = serve_command(
        preset, "--port", str(port), "--served-model-name", MODEL,
        "--max-model-len", "128", "--dtype", "float32", "--enforce-eager",
    )  # fmt: skip
    with running_server(command, port, model_name=MODEL) as (base_url, _):
        yield openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def chat(client, messages):
    return client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )


def image_message(text, image):
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": image_data_url(image)}},
            {"type": "text", "text": text},
        ],
    }


def test_an_image_and_a_prompt_give_the_tokens_of_generate(client, preset):
    reply = chat(client, [image_message("answer en what colour is it?", IMAGES[1])])
    (prompt_ids, tokens), = pali_gemma_greedy(
        preset, [("answer en what colour is it?\n", IMAGES[1])], MAX_TOKENS
    )
    assert reply.prompt_token_ids[-len(prompt_ids) :] == prompt_ids
    assert len(reply.prompt_token_ids) == len(prompt_ids) + 16  # The image's rows.
    assert reply.choices[0].token_ids == tokens


@pytest.mark.parametrize(
    "messages, cause",
    [
        ([{"role": "user", "content": "caption en"}], "send exactly one image"),
        (
            [
                {"role": "system", "content": "Be brief."},
                image_message("caption en", IMAGES[0]),
            ],
            "single user message",
        ),
    ],
)
def test_what_paligemma_does_not_take_is_a_400(client, messages, cause):
    with pytest.raises(openai.BadRequestError, match=cause):
        chat(client, messages)
    reply = chat(client, [image_message("caption en", IMAGES[0])])
    assert len(reply.choices[0].token_ids) == MAX_TOKENS
