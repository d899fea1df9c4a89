"""A text embedder through `vllm-keras-hub serve` and the official `openai` client.

One server of the tiny EmbeddingGemma-form preset (bidirectional attention,
mean pooling, its own projection head, Matryoshka dimensions), started with
no embedding flag at all, as a user would. `/v1/embeddings` answers the
preset's own embeddings; `/v1/score` and `/v1/rerank`, which vLLM offers
for embedding models as cosine similarity, score with them. Bad requests get
a 400 naming the cause, and the server keeps serving.
"""

import json
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest

from vllm_keras_hub.testing.embedders import keras_hub_embeddings
from vllm_keras_hub.testing.server import free_port
from vllm_keras_hub.testing.server import running_server
from vllm_keras_hub.testing.server import serve_command

MODEL = "tiny-embedder"
TEXTS = ["Hi", "Mars is red", "The quick brown fox jumps over the lazy dog."]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def preset(shared):
    return shared.embedder("embedding_gemma")


@pytest.fixture(scope="module")
def server(preset):
    port = free_port()
    command = serve_command(
        preset, "--port", str(port), "--served-model-name", MODEL,
        "--dtype", "float32", "--enforce-eager",
    )  # fmt: skip
    with running_server(command, port, model_name=MODEL) as (base_url, _):
        yield base_url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def oracle(preset):
    embeddings, _ = keras_hub_embeddings(preset, TEXTS)
    return embeddings


def embed(client, texts, **kwargs):
    response = client.embeddings.create(model=MODEL, input=texts, **kwargs)
    return np.array([item.embedding for item in response.data])


def post(server, path, body):
    request = urllib.request.Request(
        f"{server}{path}",
        data=json.dumps({"model": MODEL, **body}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def assert_still_serving(client, oracle):
    np.testing.assert_allclose(embed(client, TEXTS[:1]), oracle[:1], atol=TOLERANCE, rtol=0)


def test_embeddings_are_the_presets_own(client, oracle):
    np.testing.assert_allclose(embed(client, TEXTS), oracle, atol=TOLERANCE, rtol=0)


def test_dimensions_give_the_truncated_normalized_embedding(client, oracle):
    got = embed(client, TEXTS, dimensions=128)
    want = oracle[:, :128] / np.linalg.norm(oracle[:, :128], axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)


def test_score_and_rerank_are_the_cosine_of_the_embeddings(server, oracle):
    scores = post(server, "/v1/score", {"text_1": TEXTS[0], "text_2": TEXTS[1:]})
    want = oracle[1:] @ oracle[0]  # Unit vectors: cosine is the dot product.
    got = [item["score"] for item in sorted(scores["data"], key=lambda d: d["index"])]
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)
    ranked = post(server, "/v1/rerank", {"query": TEXTS[0], "documents": TEXTS[1:]})
    got = {item["index"]: item["relevance_score"] for item in ranked["results"]}
    np.testing.assert_allclose([got[0], got[1]], want, atol=TOLERANCE, rtol=0)


def test_a_text_over_the_exact_window_is_a_400(client, oracle):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 32"):
        embed(client, ["Mars is red " * 12])
    assert_still_serving(client, oracle)


def test_a_dimension_not_trained_is_a_400(client, oracle):
    with pytest.raises(openai.BadRequestError, match=r"Matryoshka dimensions \[256, 128\]"):
        embed(client, TEXTS[:1], dimensions=100)
    assert_still_serving(client, oracle)


def test_an_empty_input_list_is_a_400(client, oracle):
    with pytest.raises(openai.BadRequestError, match="at least one prompt"):
        embed(client, [])
    assert_still_serving(client, oracle)


def test_chat_messages_are_a_400_naming_the_input_to_send(server, client, oracle):
    with pytest.raises(urllib.error.HTTPError) as error:
        post(server, "/v1/embeddings", {"messages": [{"role": "user", "content": "Hi"}]})
    assert error.value.code == 400
    assert "send them as `input`" in error.value.read().decode()
    assert_still_serving(client, oracle)


def test_generation_routes_are_not_served(server, client, oracle):
    with pytest.raises(urllib.error.HTTPError) as error:
        post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert error.value.code == 404
    assert_still_serving(client, oracle)
