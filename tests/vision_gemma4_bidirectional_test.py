"""Images served through vLLM's multimodal API: a Gemma4 preset that attends
bidirectionally within each image (`use_vision_bidirectional_attention`, as
the published 26B and 31B presets), in its sliding-window layers.

The oracle is the preset's full forward with images
(`image_oracle.gemma4_full_forward_with_images`): KerasHub 0.32's
`generate()` prefills through its cache, where the decoder block never
applies the bidirectional mask, so it attends causally over the images
(`test_generate_attends_causally_over_images` shows it). The tiny preset's
window (384 tokens) holds one image's 282 tokens and some text. Video
frames are images to its vision encoder and its mask: each frame's tokens
attend bidirectionally within the frame. One compiled engine with chunked prefill (320 tokens a step: an image is
never split, `image_attention.py`) and prefix caching serves every test.
"""

import keras
import numpy as np
import pytest
import torch
from vllm import SamplingParams

from vllm_keras_hub.entrypoints.llm import KerasHubLLM
from vllm_keras_hub.settings import UnsupportedImageServingError
from vllm_keras_hub.settings import check_image_settings
from vllm_keras_hub.testing import support_matrix
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.image_oracle import gemma4_full_forward_with_images
from vllm_keras_hub.testing.image_oracle import image_parts
from vllm_keras_hub.testing.image_oracle import image_prompt_inputs
from vllm_keras_hub.testing.image_oracle import keras_hub_greedy_with_images
from vllm_keras_hub.testing.images import IMAGES
from vllm_keras_hub.testing.images import (
    assert_the_second_hits_the_prefix_cache_inside_the_image,
)
from vllm_keras_hub.testing.images import assert_tokens
from vllm_keras_hub.testing.images import batch_prompts
from vllm_keras_hub.testing.images import image_positions
from vllm_keras_hub.testing.images import request
from vllm_keras_hub.testing.images import same_image_twice
from vllm_keras_hub.testing.media_encoders import GEMMA4_IMAGE_WINDOW
from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

MAX_NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
STEP_TOKENS = 320
PROMPTS = batch_prompts("<|image|>") + [
    # The image ends past the 384-token window: its rows see keys back to
    # the window's edge only.
    (" ".join(["word"] * 120) + " <|image|> caption", [IMAGES[0]]),
]


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return build_tiny_vision_preset(
        str(tmp_path_factory.mktemp("gemma4_bidirectional")),
        "gemma4",
        bidirectional=True,
        video=True,
    )


@pytest.fixture(scope="module")
def expected(preset):
    return gemma4_full_forward_with_images(preset, PROMPTS, MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def llm(preset):
    with in_process_llm(
        f"keras_hub:{preset}",
        enforce_eager=False,
        max_model_len=1024,
        enable_chunked_prefill=True,
        max_num_batched_tokens=STEP_TOKENS,
        enable_prefix_caching=True,
        limit_mm_per_prompt={"image": 2, "video": 1},
        block_size=32,
    ) as llm:
        yield llm


def test_images_in_a_batch_match_the_full_forward(llm, preset, expected):
    row = "gemma4 + vision encoder, bidirectional"
    support_matrix.record(row, "Gemma4Backbone", images="FAIL")
    outputs = llm.generate([request(*p) for p in PROMPTS], GREEDY, use_tqdm=False)
    model = served_model(llm)
    assert model.compiled or model.was_aot_compile_fn_loaded_from_disk
    assert_tokens(outputs, expected)
    assert image_positions(preset, expected[-1][0])[-1] >= GEMMA4_IMAGE_WINDOW
    support_matrix.record(row, "Gemma4Backbone", images="pass (full forward)")


def test_generate_attends_causally_over_images(preset, expected):
    """KerasHub's bug, shown: `generate()`'s tokens differ from its own
    full forward's. (By hand: they equal those of the same weights with
    `use_vision_bidirectional_attention` off.)"""
    generated = keras_hub_greedy_with_images(preset, PROMPTS[:1], MAX_NEW_TOKENS)
    assert generated[0][0] == expected[0][0]
    assert generated[0][1] != expected[0][1]


def test_video_frames_attend_within_themselves_as_the_full_forward(llm, preset):
    """Each frame's soft tokens are one run of the backbone's vision mask,
    so they attend bidirectionally within the frame: the served tokens are
    the full forward's, and `generate()`'s (causal, its bug) differ."""
    from vllm_keras_hub.testing import videos

    row = "gemma4 + vision encoder, bidirectional"
    support_matrix.record(row, "Gemma4Backbone", video="FAIL")
    prompts = [
        ("Watch: <|video|> what happens?", videos.random_video(0)),
        ("What is in<|video|>", videos.random_video(3, height=64, width=30, fps=30.0)),
    ]
    expected = gemma4_full_forward_with_images(preset, prompts, MAX_NEW_TOKENS)
    requests = [videos.request(text, video=video) for text, video in prompts]
    outputs = llm.generate(requests, GREEDY, use_tqdm=False)
    assert_tokens(outputs, expected)
    causal = keras_hub_greedy_with_images(preset, prompts, MAX_NEW_TOKENS)
    assert all(c[1] != e[1] for c, e in zip(causal, expected))
    support_matrix.record(row, "Gemma4Backbone", video="pass (full forward)")


def test_the_same_image_again_is_served_from_the_prefix_cache(llm, preset):
    """The cached blocks end inside the image; the rest of the image is
    computed in one step and attends to the cached part and back."""
    prompts = same_image_twice("<|image|>")
    expected = gemma4_full_forward_with_images(preset, prompts, MAX_NEW_TOKENS)
    assert_the_second_hits_the_prefix_cache_inside_the_image(
        llm, preset, prompts, expected, GREEDY
    )


def test_prompt_logprobs_over_an_image_match_the_full_forward(llm, preset):
    """The image rows' own outputs, through every layer: in the KV-sharing
    layers (the tiny preset's last two) they reach no later token, only
    these logprobs."""
    text, images = PROMPTS[0]
    causal_lm, tokenizer, converter = image_parts(preset)
    ids, inputs = image_prompt_inputs(causal_lm, tokenizer, converter, text, images, 0)
    inputs["position_ids"] = torch.arange(len(ids))[None]
    inputs["padding_mask"] = torch.ones((1, len(ids)), dtype=torch.int32)
    with torch.inference_mode():
        logits = keras.ops.convert_to_numpy(causal_lm(inputs, training=False))[0]
    logits = logits - logits.max(-1, keepdims=True)
    logprobs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    (output,) = llm.generate([request(text, images)], params, use_tqdm=False)
    positions = image_positions(preset, ids)
    served = [output.prompt_logprobs[p + 1][ids[p + 1]].logprob for p in positions]
    want = [logprobs[p, ids[p + 1]] for p in positions]
    np.testing.assert_allclose(served, want, atol=1e-4)


# Last: engines refused at start-up come after those of the module's engine.
def test_splitting_an_image_is_refused_at_start_up(preset):
    with pytest.raises(UnsupportedImageServingError, match="--disable-chunked-mm-input"):
        KerasHubLLM(f"keras_hub:{preset}", disable_chunked_mm_input=False)


def test_images_longer_than_the_window_are_refused():
    """Its mask, (causal and windowed) or within the image, is not the
    window's band once an image is longer than the window."""
    image = dict(bidirectional="sliding", tokens_per_image=280, window=256)
    with pytest.raises(UnsupportedImageServingError, match="more than its sliding window"):
        check_image_settings(image, None, True, False, None)
    check_image_settings(image, 0, True, False, None)


# Last: an engine of its own, whose shutdown would end the module's.
def test_clips_stay_causal_beside_bidirectional_images(tmp_path):
    """No published preset has both, but a bidirectional preset with an
    audio encoder serves clips causally, as its full forward attends: the
    image attention sees the image tokens alone, though vLLM marks the
    clip's tokens multimodal too; a video's frames stay bidirectional."""
    from vllm_keras_hub.testing import audio
    from vllm_keras_hub.testing import videos

    preset = build_tiny_vision_preset(
        str(tmp_path / "with_audio"), "gemma4", bidirectional=True, audio=True, video=True
    )
    video, clip = videos.random_video(0), audio.noise_clip(6)
    prompts = [
        ("See <|image|> hear <|audio|> now", [IMAGES[1]], [audio.noise_clip(5, seconds=1.0)]),
        ("Hear <|audio|> then", [], [audio.tone_clip(500, seconds=2.0)]),
        ("Hello there", []),
        ("Watch <|video|> hear <|audio|> now", video, [clip]),
    ]
    expected = gemma4_full_forward_with_images(preset, prompts, MAX_NEW_TOKENS)
    requests = [audio.request(*p) for p in prompts[:3]]
    requests.append(
        {
            "prompt": prompts[3][0],
            "multi_modal_data": {"video": video, "audio": [(clip, audio.RATE)]},
        }
    )
    with in_process_llm(
        f"keras_hub:{preset}",
        max_model_len=1024,
        limit_mm_per_prompt={"image": 1, "audio": 1, "video": 1},
    ) as llm:
        outputs = llm.generate(requests, GREEDY, use_tqdm=False)
    assert_tokens(outputs, expected)
