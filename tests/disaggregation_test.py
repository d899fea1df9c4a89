"""Prefill and decode in two engines, through vLLM's `ExampleConnector`.

A producer engine prefills each prompt and saves its KV cache as files; a
consumer engine, started afterwards on the same folder, loads the prompt's
KV and decodes. The consumer must give the preset's own `generate()`
tokens, and its count of prompt tokens it did not compute
(`num_cached_tokens`, in a fresh engine) shows that it loaded them: all of
each prompt but its last token, in whole blocks, as `ExampleConnector`
moves them. Gemma4 covers sliding-window and KV-sharing layers.
"""

import json

import pytest
from vllm import SamplingParams

from vllm_keras_hub.entrypoints.llm import KerasHubLLM
from vllm_keras_hub.hybrid_settings import UnsupportedHybridConfigError
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.server import free_port
from vllm_keras_hub.testing.server import running_servers
from vllm_keras_hub.testing.server import serve_command

MAX_NEW_TOKENS = 12
BLOCK = 32  # The smallest block vLLM's CPU attention takes.
PROMPTS = [
    "KerasHub models served by vLLM use a paged KV cache, continuous batching "
    "and chunked prefill, so prefill and decode can run on other machines.",
    "One two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen twenty",
    "Hello there",  # Shorter than a block: nothing to load, all computed.
]


def kv_transfer(role, folder):
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(folder)},
    }


def loaded_tokens(prompt_ids):
    """The prompt tokens `ExampleConnector` loads: whole blocks, last excluded."""
    return (len(prompt_ids) - 1) // BLOCK * BLOCK


@pytest.mark.parametrize("family", ["llama3", "gemma4"])
def test_a_consumer_decodes_from_the_producers_kv(family, shared, tmp_path):
    preset = shared.preset(family)
    expected = shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS)
    settings = dict(block_size=BLOCK, enable_prefix_caching=False)
    producer = kv_transfer("kv_producer", tmp_path)
    with in_process_llm(f"keras_hub:{preset}", kv_transfer_config=producer, **settings) as llm:
        llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    consumer = kv_transfer("kv_consumer", tmp_path)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    with in_process_llm(f"keras_hub:{preset}", kv_transfer_config=consumer, **settings) as llm:
        outputs = llm.generate(PROMPTS, greedy, use_tqdm=False)
    for output, (prompt_ids, generated_ids) in zip(outputs, expected, strict=True):
        assert output.prompt_token_ids == prompt_ids
        assert list(output.outputs[0].token_ids) == generated_ids
        assert output.num_cached_tokens == loaded_tokens(prompt_ids)
    assert sum(output.num_cached_tokens for output in outputs) >= 2 * BLOCK


def test_images_clips_and_videos_are_encoded_on_the_prefill_side_only(shared, tmp_path):
    """A Gemma4 preset with images, audio and video: where the consumer
    loads the KV of every block holding an image's, a clip's or a video's
    tokens, it runs no
    encoder (its encoder calls are counted); where an image reaches into
    the last partial block, which it computes, it encodes that image. Every
    row is `generate()`'s tokens."""
    from vllm_keras_hub.testing import audio
    from vllm_keras_hub.testing import videos
    from vllm_keras_hub.testing.engines import served_model
    from vllm_keras_hub.testing.image_oracle import keras_hub_greedy_with_images
    from vllm_keras_hub.testing.images import IMAGES
    from vllm_keras_hub.testing.images import assert_tokens

    preset = shared.vision_preset("gemma4")
    tail = " and then say what it shows in a few short words, please, for the record."
    prompts = [
        ("Look at <|image|>" + tail, [IMAGES[1]]),
        ("Listen to <|audio|>" + tail, [], [audio.noise_clip(4, seconds=2.0)]),
        ("Watch <|video|>" + tail, videos.random_video(7)),
        # The image ends the prompt: its last tokens are the consumer's.
        ("Look at <|image|>", [IMAGES[2]]),
    ]
    expected = keras_hub_greedy_with_images(preset, prompts, MAX_NEW_TOKENS)
    settings = dict(
        block_size=BLOCK,
        enable_prefix_caching=False,
        max_model_len=1024,
        limit_mm_per_prompt={"image": 1, "audio": 1, "video": 1},
    )
    requests = [audio.request(*prompt) for prompt in prompts]
    requests[2] = videos.request(prompts[2][0], video=prompts[2][1])

    def counting(llm):
        model, calls = served_model(llm), []
        encode = model.embed_multimodal
        model.embed_multimodal = lambda **fields: calls.append(1) or encode(**fields)
        return calls

    producer = kv_transfer("kv_producer", tmp_path)
    with in_process_llm(f"keras_hub:{preset}", kv_transfer_config=producer, **settings) as llm:
        produced = counting(llm)
        llm.generate(requests, SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    consumer = kv_transfer("kv_consumer", tmp_path)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    with in_process_llm(f"keras_hub:{preset}", kv_transfer_config=consumer, **settings) as llm:
        consumed = counting(llm)
        outputs = llm.generate(requests[:3], greedy, use_tqdm=False)
        assert len(produced) >= 1 and consumed == []
        outputs += llm.generate(requests[3:], greedy, use_tqdm=False)
        assert len(consumed) == 1
    assert_tokens(outputs, expected)
    for output, (prompt_ids, _) in zip(outputs, expected, strict=True):
        assert output.num_cached_tokens == loaded_tokens(prompt_ids)


def test_hybrid_presets_refuse_kv_transfer(shared, tmp_path):
    with pytest.raises(UnsupportedHybridConfigError, match="recurrent state"):
        KerasHubLLM(
            f"keras_hub:{shared.preset('qwen3_5')}",
            kv_transfer_config=kv_transfer("kv_consumer", tmp_path),
        )


def _serve(preset, port, role, folder):
    return serve_command(
        f"keras_hub:{preset}",
        "--port", str(port),
        "--dtype", "float32",
        "--max-model-len", "256",
        "--enforce-eager",
        "--block-size", str(BLOCK),
        "--no-enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--kv-transfer-config", json.dumps(kv_transfer(role, folder)),
    )  # fmt: skip


def test_two_servers_and_the_route_between_them(shared, tmp_path):
    """Two `vllm-keras-hub serve` processes; each request goes to the
    producer for its prefill (one token), then to the consumer, which
    answers with the oracle's tokens from the producer's KV."""
    import openai

    preset = shared.preset("llama3")
    model = f"keras_hub:{preset}"
    expected = shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS)
    ports = free_port(), free_port()
    commands = [
        (_serve(preset, port, role, tmp_path), port)
        for port, role in zip(ports, ("kv_producer", "kv_consumer"))
    ]
    with running_servers(commands, model_name=model) as servers:
        clients = [
            openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            for url, _ in servers
        ]
        for prompt, (prompt_ids, generated_ids) in zip(PROMPTS, expected, strict=True):
            clients[0].completions.create(
                model=model, prompt=prompt, max_tokens=1, temperature=0
            )
            answer = clients[1].completions.create(
                model=model,
                prompt=prompt,
                max_tokens=MAX_NEW_TOKENS,
                temperature=0,
                extra_body={"ignore_eos": True, "return_token_ids": True},
            )
            assert answer.choices[0].token_ids == generated_ids
            cached = answer.usage.prompt_tokens_details.cached_tokens or 0
            assert cached == loaded_tokens(prompt_ids)
