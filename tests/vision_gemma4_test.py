"""Images and audio served through vLLM's multimodal API: a Gemma4 preset,
causal.

Gemma4 presets without `use_vision_bidirectional_attention` (the published
2B and 4B ones) attend causally over their images, so vLLM may split an
image's tokens over prefill steps. Every image is `<|image>`, 280 soft
tokens (its patches pooled, padded by its aspect ratio with zero
embeddings, as KerasHub's converter and encoder make them) and `<image|>`.
One eager engine with chunked prefill (128 tokens a step, so every image is
split) and prefix caching serves every test; the oracle is the preset's own
`generate()` (`image_oracle.keras_hub_greedy_with_images`). The preset
carries a tiny audio encoder, its audio tokens and its audio converter, as
the published E2B and E4B presets do: each clip is `<|audio>`, one
`<|audio|>` per 4 frames of it (up to 750, at 30 s), and `<audio|>`. And
its video converter, as every published Gemma4 preset has it (4 frames
per video here, 32 published): each video is one `mm:ss <|image>` +
`<|video|>` per soft token + `<image|>` per frame.
Bidirectional presets: `vision_gemma4_bidirectional_test.py`.
"""

import numpy as np
import pytest
import torch
from vllm import SamplingParams

from vllm_keras_hub.models.multimodal import to_pixels
from vllm_keras_hub.testing import audio
from vllm_keras_hub.testing import support_matrix
from vllm_keras_hub.testing import videos
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.image_oracle import keras_hub_greedy_with_images
from vllm_keras_hub.testing.images import IMAGES
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
STEP_TOKENS = 128
PROMPTS = batch_prompts("<|image|>")


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("gemma4_vision"))
    # Seed 2: random weights whose answers tell the test's images apart.
    return build_tiny_vision_preset(directory, "gemma4", seed=2, audio=True, video=True)


@pytest.fixture(scope="module")
def llm(preset):
    with in_process_llm(
        f"keras_hub:{preset}",
        max_model_len=1024,
        enable_chunked_prefill=True,
        max_num_batched_tokens=STEP_TOKENS,
        enable_prefix_caching=True,
        limit_mm_per_prompt={"image": 2, "audio": 1, "video": 1},
        block_size=32,
    ) as llm:
        yield llm


def test_images_in_a_batch_match_generate(llm, preset):
    """Three aspect ratios in one batch: the encoder pools each image by its
    own grid, as `generate()` does for each prompt alone."""
    row = "gemma4 + vision encoder"
    support_matrix.record(row, "Gemma4Backbone", images="FAIL")
    expected = keras_hub_greedy_with_images(preset, PROMPTS, MAX_NEW_TOKENS)
    outputs = llm.generate([request(*p) for p in PROMPTS], GREEDY, use_tqdm=False)
    assert_tokens(outputs, expected)
    assert len({tuple(expected[i][1]) for i in (0, 3, 4)}) == 3
    # 280 soft tokens per image, split over 128-token steps.
    positions = image_positions(preset, expected[0][0])
    assert len(positions) == 280 and positions[0] < STEP_TOKENS < positions[-1]
    support_matrix.record(row, "Gemma4Backbone", images="pass")


def test_the_same_image_again_is_served_from_the_prefix_cache(llm, preset):
    prompts = same_image_twice("<|image|>")
    expected = keras_hub_greedy_with_images(preset, prompts, MAX_NEW_TOKENS)
    assert_the_second_hits_the_prefix_cache_inside_the_image(
        llm, preset, prompts, expected, GREEDY
    )


def test_each_image_is_encoded_by_its_own_grid(llm, preset):
    """KerasHub 0.32's `Gemma4VisionAveragePooling` takes the pooled grid's
    width from the widest image of its batch: two images of different
    aspect ratios encoded together fail (or, where the indices stay in
    range, pool the narrower one wrongly), so its `generate()` fails on a
    prompt with such images. The served model encodes each image alone
    (`families/gemma4/media.py`), as `generate()` does a prompt's one image."""
    narrow, wide = IMAGES[1], IMAGES[2]
    encoder = served_model(llm).backbone.vision_encoder
    pixels = to_pixels(preset, [narrow, wide])
    alone = to_pixels(preset, [narrow])

    def encode(fields):
        with torch.inference_mode():
            return encoder(
                {
                    "pixel_values": fields["pixel_values"][None],
                    "pixel_position_ids": fields["pixel_position_ids"][None].int(),
                }
            )[0].numpy()

    with pytest.raises(RuntimeError, match="Class values must be smaller"):
        encode(pixels)
    # As vLLM's runner calls it.
    with torch.inference_mode():
        embeddings = served_model(llm).embed_multimodal(**pixels)
    # The served embeddings are pre-scaled by 1/sqrt(hidden).
    scale = served_model(llm).backbone.hidden_dim ** 0.5
    np.testing.assert_allclose(
        embeddings[0].numpy() * scale, encode(alone)[0], rtol=1e-5, atol=1e-5
    )


def test_an_encoder_pooling_otherwise_than_the_converter_is_refused(preset, tmp_path):
    """The converter reloads pooling by 3 (its saved config drops
    `pooling_kernel_size`): an encoder pooling by 2 would misplace its
    patches, so the model class refuses it when the engine loads it."""
    import json
    import shutil

    from vllm_keras_hub.models.probe import RouteError

    pooled_by_2 = str(tmp_path / "pooled_by_2")
    shutil.copytree(preset, pooled_by_2)
    with open(f"{pooled_by_2}/config.json") as f:
        config = json.load(f)
    encoder = config["config"]["vision_encoder"]["config"]
    assert encoder["pool_size"] == 3
    encoder["pool_size"] = 2
    with open(f"{pooled_by_2}/config.json", "w") as f:
        json.dump(config, f)
    message = "pooled by 3, its vision encoder takes patches of 8 pooled by 2"
    with pytest.raises(RouteError, match=message):
        with in_process_llm(
            f"keras_hub:{pooled_by_2}", max_model_len=1024, limit_mm_per_prompt={"image": 1}
        ):
            pass


AUDIO = "<|audio|>"



def test_audio_in_a_mixed_batch_matches_generate(llm, preset):
    """Each clip takes as many tokens as its frames give (0.4 s: 10; 1.7 s:
    43; 6 s: 150, split over prefill steps; 31 s: cut at 30 s, 750), beside
    an image, and text alone, in one batch."""
    row = "gemma4 + vision encoder"
    support_matrix.record(row, "Gemma4Backbone", audio="FAIL")
    prompts = [
        (f"Listen: {AUDIO} what is it?", [], [audio.noise_clip(0)]),
        (f"Listen: {AUDIO} what is it?", [], [audio.tone_clip(440)]),
        (f"Listen: {AUDIO} what is it?", [], [audio.noise_clip(1, seconds=1.7)]),
        ("Hello there", []),
        (f"See <|image|> hear {AUDIO} now", [random_image(4)], [audio.noise_clip(0)]),
        (f"A long one {AUDIO} ok", [], [audio.tone_clip(300, seconds=6.0)]),
        (f"Too long {AUDIO} ok", [], [audio.noise_clip(3, seconds=31.0)]),
    ]
    expected = keras_hub_greedy_with_images(preset, prompts, MAX_NEW_TOKENS)
    outputs = llm.generate([audio.request(*p) for p in prompts], GREEDY, use_tqdm=False)
    assert_tokens(outputs, expected)
    counts = [len(audio.audio_positions(preset, ids)) for ids, _ in expected]
    # By hand from keras-hub's preprocessor: `samples // 160` valid frames
    # (at most 3000), over 4 rounded up (`models/audio_test.py`).
    assert counts == [10, 10, 43, 0, 10, 150, 750]
    positions = audio.audio_positions(preset, expected[5][0])
    assert positions[0] < STEP_TOKENS <= positions[-1]
    # The clip decides the answer.
    assert len({tuple(expected[i][1]) for i in (0, 1, 2)}) == 3
    support_matrix.record(row, "Gemma4Backbone", audio="pass")


def test_the_same_clip_again_is_served_from_the_prefix_cache(llm, preset):
    """The second prompt's cached blocks end inside the clip (here its hits
    come 64 tokens at a time: a 57-token prompt hits nothing, a 107-token
    one 64)."""
    clip = audio.noise_clip(9, seconds=3.0)
    prompts = [
        (f"Listen to this clip carefully: {AUDIO} what is it?", [], [clip]),
        (f"Listen to this clip carefully: {AUDIO} and its mood?", [], [clip]),
    ]
    audio.assert_the_second_hits_the_prefix_cache_inside_the_clip(llm, preset, prompts, GREEDY)


def test_an_input_audio_chat_part_renders_and_matches_generate(llm, preset):
    """`LLM.chat` with the official template: an `input_audio` WAV part
    renders as `<|audio|>` where it stands, and gives `generate()`'s tokens
    on the samples vLLM decodes."""
    import base64

    wav = audio.encoded(audio.tone_clip(520, seconds=1.2), "wav")
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
    content = [{"type": "text", "text": "What is said in"}, part, {"type": "text", "text": "this clip?"}]
    outputs = llm.chat([{"role": "user", "content": content}], GREEDY, use_tqdm=False)
    prompt = (
        "<|turn>user\nWhat is said in<|audio|>this clip?<turn|>\n"
        "<|turn>model\n<|channel>thought\n<channel|>"
    )
    expected = keras_hub_greedy_with_images(
        preset, [(prompt, [], [audio.decoded(wav)])], MAX_NEW_TOKENS
    )
    assert_tokens(outputs, expected)
    assert len(audio.audio_positions(preset, expected[0][0])) == 30


def test_a_clip_shorter_than_a_frame_or_missing_is_refused(llm):
    """Gemma4's preprocessor gives a clip of fewer than 160 samples no
    tokens, and a placeholder with no clip has nothing to expand to: each
    request is refused with the reason, and the engine serves on."""
    with pytest.raises(ValueError, match="shorter than one frame"):
        llm.generate([audio.request(f"Hi {AUDIO}", [], [np.zeros(100, "float32")])], GREEDY)
    clip = audio.noise_clip(0)
    with pytest.raises(ValueError, match="more <\\|audio\\|> placeholders than"):
        llm.generate([audio.request(f"Hi {AUDIO} and {AUDIO}", [], [clip])], GREEDY)
    assert len(llm.generate(["Hello"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 8


VIDEO = "<|video|>"


def test_videos_in_a_mixed_batch_match_generate(llm, preset):
    """Videos of two frame sizes and frame rates (timestamps past a minute),
    one given 8 frames that the converter keeps 4 of, beside an image and
    text alone, in one batch: the preprocessor's own spans (the first
    timestamp tokenized with the text before it) and tokens. Each video
    spans several prefill steps."""
    row = "gemma4 + vision encoder"
    support_matrix.record(row, "Gemma4Backbone", video="FAIL")
    eight = videos.random_video(3, frames=8, stride=30)
    # linspace(0, 7, 4), cast to int32: the converter's own choice.
    kept = [0, 2, 4, 7]
    four_of_eight = videos.Video(
        eight.frames[kept], {**eight.metadata, "frames_indices": [30 * i for i in kept]}
    )
    # (text, images, video) as served, and what the oracle takes.
    served = [
        (f"Watch: {VIDEO} what happens?", [], videos.random_video(1)),
        ("Hello there", [], None),
        (f"Watch: {VIDEO} what happens?", [], videos.random_video(2)),
        ("a <|image|> caption", [IMAGES[0]], None),
        (f"What is in{VIDEO}", [], videos.random_video(4, 64, 30, fps=30.0, stride=900)),
        (f"Watch: {VIDEO} what happens?", [], eight),
    ]
    oracle_prompts = [(text, video or images) for text, images, video in served[:-1]]
    oracle_prompts.append((served[-1][0], four_of_eight))
    expected = keras_hub_greedy_with_images(preset, oracle_prompts, MAX_NEW_TOKENS)
    requests = [videos.request(text, images, video) for text, images, video in served]
    outputs = llm.generate(requests, GREEDY, use_tqdm=False)
    assert_tokens(outputs, expected)
    # 48x64 frames take 63 soft tokens each, 64x30 ones 60; a video spans
    # steps of 128 tokens.
    counts = [len(videos.video_positions(preset, ids)) for ids, _ in expected]
    assert counts == [4 * 63, 0, 4 * 63, 0, 4 * 60, 4 * 63]
    positions = videos.video_positions(preset, expected[0][0])
    assert positions[0] < STEP_TOKENS < positions[-1]
    # The frames decide the answer.
    assert expected[0][1] != expected[2][1]
    support_matrix.record(row, "Gemma4Backbone", video="pass")


def test_the_same_video_again_is_served_from_the_prefix_cache(llm, preset):
    """The second prompt's cached blocks end inside the video: the rest of
    its frames are computed in the next step, from the encoder cache."""
    video = videos.random_video(8)
    prompts = [
        (f"Watch this video carefully: {VIDEO} what is it?", video),
        (f"Watch this video carefully: {VIDEO} and its mood?", video),
    ]
    expected = keras_hub_greedy_with_images(preset, prompts, MAX_NEW_TOKENS)
    first = llm.generate([videos.request(prompts[0][0], video=video)], GREEDY, use_tqdm=False)
    second = llm.generate([videos.request(prompts[1][0], video=video)], GREEDY, use_tqdm=False)
    assert_tokens(first + second, expected)
    positions = videos.video_positions(preset, expected[1][0])
    assert positions[0] < second[0].num_cached_tokens <= positions[-1]


def test_a_video_url_chat_part_renders_and_matches_generate(llm, preset):
    """`LLM.chat` with the official template: a `video_url` part (an MPEG-4
    file as a data URI) renders as `<|video|>` where it stands; vLLM's
    loader keeps the converter's 4 frames of its 10 (as `KerasHubLLM` and
    `serve` set it), with their source indices."""
    import base64

    data = videos.encoded(videos.random_video(5, frames=10), fps=2)
    url = f"data:video/mp4;base64,{base64.b64encode(data).decode()}"
    content = [
        {"type": "text", "text": "What happens in"},
        {"type": "video_url", "video_url": {"url": url}},
        {"type": "text", "text": "this video?"},
    ]
    outputs = llm.chat([{"role": "user", "content": content}], GREEDY, use_tqdm=False)
    prompt = (
        "<|turn>user\nWhat happens in<|video|>this video?<turn|>\n"
        "<|turn>model\n<|channel>thought\n<channel|>"
    )
    decoded = videos.decoded(data, num_frames=4)
    assert decoded.metadata["frames_indices"] == [0, 3, 6, 9]
    expected = keras_hub_greedy_with_images(preset, [(prompt, decoded)], MAX_NEW_TOKENS)
    assert_tokens(outputs, expected)


def test_a_video_without_its_placeholder_or_metadata_is_refused(llm):
    """As vLLM's own Gemma4: a video needs its frames' indices and frame
    rate for the timestamps; a placeholder with no video has nothing to
    expand to. Each request is refused with the reason; the engine serves on."""
    video = videos.random_video(0)
    with pytest.raises(ValueError, match="metadata is required"):
        frames_only = {"prompt": f"Hi {VIDEO}", "multi_modal_data": {"video": video.frames}}
        llm.generate([frames_only], GREEDY)
    with pytest.raises(ValueError, match="more <\\|video\\|> placeholders than"):
        llm.generate([videos.request(f"Hi {VIDEO} and {VIDEO}", video=video)], GREEDY)
    assert len(llm.generate(["Hello"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 8


# Last: an engine of its own, started while the module's is still open.
def test_text_only_serving_of_a_vision_preset(llm, preset):
    """With no images allowed, vLLM hands the model token ids alone (no
    `embed_input_ids`): they are its per-layer ids too."""
    prompts = [("Hello there", []), ("The quick brown fox", [])]
    expected = keras_hub_greedy_with_images(preset, prompts, MAX_NEW_TOKENS)
    with in_process_llm(
        f"keras_hub:{preset}",
        limit_mm_per_prompt={"image": 0, "audio": 0, "video": 0},
        block_size=32,
    ) as text_llm:
        assert type(served_model(text_llm)).__name__ == "KerasHubGemma4VisionForCausalLM"
        outputs = text_llm.generate([p for p, _ in prompts], GREEDY, use_tqdm=False)
    assert_tokens(outputs, expected)
