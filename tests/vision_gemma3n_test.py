"""Images and audio served through vLLM's multimodal API: a Gemma3n preset.

Gemma3n attends causally over its images, so vLLM may split an image's
tokens over prefill steps as for its own models. One compiled engine with
chunked prefill (24 tokens a step) and prefix caching serves every test;
the oracle is the preset's own `generate()` with images and audio clips
(`image_oracle.keras_hub_greedy_with_images`). The preset carries a tiny
audio encoder and its audio converter, as the published ones do.
"""

import pytest
from vllm import SamplingParams

from vllm_keras_hub.testing import audio
from vllm_keras_hub.testing import support_matrix
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.image_oracle import keras_hub_greedy_with_images
from vllm_keras_hub.testing.images import (
    assert_the_second_hits_the_prefix_cache_inside_the_image,
)
from vllm_keras_hub.testing.images import assert_tokens
from vllm_keras_hub.testing.images import batch_prompts
from vllm_keras_hub.testing.images import image_positions
from vllm_keras_hub.testing.images import random_image
from vllm_keras_hub.testing.images import request
from vllm_keras_hub.testing.images import same_image_twice
from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

MAX_NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
STEP_TOKENS = 24
PROMPTS = batch_prompts("<start_of_image>")


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("gemma3n_vision"))
    return build_tiny_vision_preset(directory, "gemma3n", audio=True)


@pytest.fixture(scope="module")
def llm(preset):
    with in_process_llm(
        f"keras_hub:{preset}",
        enforce_eager=False,
        enable_chunked_prefill=True,
        max_num_batched_tokens=STEP_TOKENS,
        enable_prefix_caching=True,
        limit_mm_per_prompt={"image": 2, "audio": 2},
        block_size=16,
    ) as llm:
        yield llm


def test_images_in_a_batch_match_generate(llm, preset):
    row = "gemma3n + vision encoder"
    support_matrix.record(row, "Gemma3nBackbone", images="FAIL")
    expected = keras_hub_greedy_with_images(preset, PROMPTS, MAX_NEW_TOKENS)
    outputs = llm.generate([request(*p) for p in PROMPTS], GREEDY, use_tqdm=False)
    model = served_model(llm)
    assert model.compiled or model.was_aot_compile_fn_loaded_from_disk
    assert_tokens(outputs, expected)
    # The image decides the answer: the same text, other images.
    assert len({tuple(expected[i][1]) for i in (0, 3, 4)}) == 3
    support_matrix.record(row, "Gemma3nBackbone", images="pass")


def test_an_image_split_over_two_prefill_steps(llm, preset):
    """Alone, this prompt's image starts in the first 24-token step and
    ends in the second: the second step gathers the rest of its cached
    embeddings."""
    prompt = [("Look at this: <start_of_image> ok", [random_image(5)])]
    expected = keras_hub_greedy_with_images(preset, prompt, MAX_NEW_TOKENS)
    positions = image_positions(preset, expected[0][0])
    assert positions[0] < STEP_TOKENS <= positions[-1]
    assert_tokens(llm.generate([request(*prompt[0])], GREEDY, use_tqdm=False), expected)


def test_the_same_image_again_is_served_from_the_prefix_cache(llm, preset):
    """The cached blocks end inside the image: its last tokens are computed
    in the next step, from the encoder's cached embeddings."""
    prompts = same_image_twice("<start_of_image>")
    expected = keras_hub_greedy_with_images(preset, prompts, MAX_NEW_TOKENS)
    assert_the_second_hits_the_prefix_cache_inside_the_image(
        llm, preset, prompts, expected, GREEDY
    )


AUDIO = "<start_of_audio>"



def test_audio_in_a_mixed_batch_matches_generate(llm, preset):
    """Clips padded to the soft-token count (0.4 s) and cut to it (1 s),
    with an image, two clips, and text alone, in one batch."""
    row = "gemma3n + vision encoder"
    support_matrix.record(row, "Gemma3nBackbone", audio="FAIL")
    prompts = [
        (f"Listen: {AUDIO} what is it?", [], [audio.noise_clip(0)]),
        (f"Listen: {AUDIO} what is it?", [], [audio.tone_clip(440)]),
        (f"Listen: {AUDIO} what is it?", [], [audio.noise_clip(1, seconds=1.0)]),
        ("Hello there", []),
        (f"See <start_of_image> hear {AUDIO} now", [random_image(4)], [audio.noise_clip(0)]),
        (f"two {AUDIO} and {AUDIO} compared", [], [audio.noise_clip(2), audio.tone_clip(300)]),
    ]
    expected = keras_hub_greedy_with_images(preset, prompts, MAX_NEW_TOKENS)
    outputs = llm.generate([audio.request(*p) for p in prompts], GREEDY, use_tqdm=False)
    assert_tokens(outputs, expected)
    # Each clip fills its soft tokens, and the clip decides the answer.
    assert len(audio.audio_positions(preset, expected[5][0])) == 2 * 16
    assert len({tuple(expected[i][1]) for i in (0, 1, 2)}) == 3
    support_matrix.record(row, "Gemma3nBackbone", audio="pass")


def test_a_clip_split_over_two_prefill_steps(llm, preset):
    prompt = [(f"Now hear this one: {AUDIO} ok", [], [audio.tone_clip(660)])]
    expected = keras_hub_greedy_with_images(preset, prompt, MAX_NEW_TOKENS)
    positions = audio.audio_positions(preset, expected[0][0])
    assert positions[0] < STEP_TOKENS <= positions[-1]
    assert_tokens(llm.generate([audio.request(*prompt[0])], GREEDY, use_tqdm=False), expected)


def test_the_same_clip_again_is_served_from_the_prefix_cache(llm, preset):
    """The second prompt's cached blocks end inside the clip."""
    clip = audio.noise_clip(9)
    prompts = [
        (f"Listen to this clip carefully: {AUDIO} what is it?", [], [clip]),
        (f"Listen to this clip carefully: {AUDIO} and its mood?", [], [clip]),
    ]
    audio.assert_the_second_hits_the_prefix_cache_inside_the_clip(llm, preset, prompts, GREEDY)
