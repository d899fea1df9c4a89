"""Images and video served through vLLM's multimodal API: a Qwen3.5 preset
(M-RoPE).

The preset is laid out as published: its preprocessor holds its tokenizer
(with the vision tokens) and its image and video converters, and its
backbone a vision encoder and `mrope_section`. Each image is as many
`<|image_pad|>` as its merged patches (5 to 36 here: the converter keeps
each image within 96x96 pixels, as published within 4096x4096), between
the `<|vision_start|>` and `<|vision_end|>` the prompt writes. A video is
all its frames, two a patch, each pair `<t seconds>` and its own markers
and pads. Qwen3.5 attends causally over images and videos, so vLLM may
split one over prefill steps; the Gated DeltaNet layers carry their state
across them.

One engine, compiled as vLLM's default, with chunked prefill (16 tokens a
step) and prefix caching serves every test (the server test serves eager:
`vision_server_test.py`); the oracle is the preset's full forward with its
preprocessor's M-RoPE positions (`mrope_oracle`).
"""

import pytest
from vllm import SamplingParams

from vllm_keras_hub.testing import support_matrix
from vllm_keras_hub.testing import videos
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.images import IMAGES
from vllm_keras_hub.testing.images import assert_tokens
from vllm_keras_hub.testing.images import image_positions
from vllm_keras_hub.testing.images import random_image
from vllm_keras_hub.testing.images import request
from vllm_keras_hub.testing.mrope_oracle import qwen3_5_full_forward_with_images
from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

MAX_NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
STEP_TOKENS = 16
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
ROW = "qwen3_5 + vision encoder"
# Images of 4 aspect ratios (grids of 2x3, 4x2, 1x5 and 6x6 soft tokens),
# two in one prompt, and a prompt without.
PROMPTS = [
    (f"Look closely at {IMAGE} caption", [IMAGES[0]]),
    ("Hello there", []),
    (f"two {IMAGE} and {IMAGE} compared", [IMAGES[1], IMAGES[2]]),
    (f"a {IMAGE} caption", [IMAGES[1]]),
    (f"a {IMAGE} caption", [IMAGES[2]]),
    (f"a {IMAGE} caption", [random_image(7, 96, 96)]),
]


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("qwen3_5_vision"))
    # Seed 5: random weights whose tokens both the text's positions after
    # an image and the image's rows and columns change.
    return build_tiny_vision_preset(directory, "qwen3_5", seed=5, video=True)


@pytest.fixture(scope="module")
def expected(preset):
    return qwen3_5_full_forward_with_images(preset, PROMPTS, MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def llm(preset):
    with in_process_llm(
        f"keras_hub:{preset}",
        enforce_eager=False,
        max_model_len=512,
        enable_chunked_prefill=True,
        max_num_batched_tokens=STEP_TOKENS,
        enable_prefix_caching=True,
        limit_mm_per_prompt={"image": 2, "video": 1},
    ) as llm:
        yield llm


def test_images_in_a_batch_match_the_full_forward(llm, preset, expected):
    support_matrix.record(ROW, "Qwen3_5Backbone", images="FAIL")
    model = served_model(llm)
    assert model.compiled or model.was_aot_compile_fn_loaded_from_disk
    # No profile run of the encoder on the largest image (`settings.settle`).
    assert llm.llm_engine.model_config.multimodal_config.skip_mm_profiling
    outputs = llm.generate([request(*p) for p in PROMPTS], GREEDY, use_tqdm=False)
    assert_tokens(outputs, expected)
    # The images change the tokens, and the first one is split over steps.
    assert len({tuple(expected[i][1]) for i in (0, 3, 4)}) == 3
    positions = image_positions(preset, expected[0][0])
    assert len(positions) == 6 and positions[0] < STEP_TOKENS <= positions[-1]
    support_matrix.record(ROW, "Qwen3_5Backbone", images="pass")


@pytest.mark.parametrize("positions", [True, "temporal"], ids=["plain", "no_rows_or_columns"])
def test_other_positions_would_be_wrong(preset, expected, positions):
    """Each token at its index in all three rows (RoPE as for text), or
    image tokens without their rows and columns (the temporal row in all
    three), gives other tokens for some of the image prompts: the oracle
    sees each part of M-RoPE."""
    other = qwen3_5_full_forward_with_images(
        preset, PROMPTS, MAX_NEW_TOKENS, plain_positions=positions
    )
    differs = [e[1] != o[1] for e, o in zip(expected, other, strict=True)]
    assert any(differs) and not differs[1]


def test_a_prefix_cache_hit_ends_inside_an_image(llm, preset):
    """Hybrid models cache whole blocks of the state page's size (256
    tokens here); a prompt whose 256th token is in its image hits the
    cache there, and its image's last tokens are computed after it."""
    image = random_image(7, 96, 96)  # 6x6 soft tokens
    lead = "Look at this picture, " * 14  # 238 tokens
    prompts = [(f"{lead}{IMAGE} what is it?", [image]), (f"{lead}{IMAGE} its colour?", [image])]
    expected = qwen3_5_full_forward_with_images(preset, prompts, MAX_NEW_TOKENS)
    first = llm.generate([request(*prompts[0])], GREEDY, use_tqdm=False)
    second = llm.generate([request(*prompts[1])], GREEDY, use_tqdm=False)
    assert_tokens(first + second, expected)
    positions = image_positions(preset, expected[1][0])
    assert len(positions) == 36
    assert positions[0] < second[0].num_cached_tokens <= positions[-1]


def test_an_image_over_the_token_budget_is_refused(llm):
    """The converter rounds each side to whole merge windows, so a long,
    thin image takes more soft tokens than its pixels would (60 here,
    over the 36 an image may take); the engine refuses it, and serves on."""
    thin = random_image(8, 10, 1000)
    with pytest.raises(ValueError, match="takes 60 soft tokens .* more than the 36"):
        llm.generate([request(f"a {IMAGE} caption", [thin])], GREEDY, use_tqdm=False)
    output = llm.generate(["Hello there"], GREEDY, use_tqdm=False)
    assert len(output[0].outputs[0].token_ids) == MAX_NEW_TOKENS


def test_videos_in_a_batch_with_images_and_text_match_the_full_forward(llm, preset):
    """Videos of 4 and 5 frames (the converter repeats the last of an odd
    count), an image and text in one batch; each video's pairs of frames
    are timestamped spans, split over the 16-token steps."""
    support_matrix.record(ROW, "Qwen3_5Backbone", video="FAIL")
    prompts = [
        (f"What happens in {VIDEO} now?", videos.random_video(1)),
        (f"a {IMAGE} caption", [IMAGES[0]]),
        ("Hello there", []),
        (f"And here {VIDEO}?", videos.random_video(2, frames=5, stride=7)),
    ]
    expected = qwen3_5_full_forward_with_images(preset, prompts, MAX_NEW_TOKENS)
    requests = [
        videos.request(text, video=media)
        if isinstance(media, videos.Video)
        else request(text, media)
        for text, media in prompts
    ]
    outputs = llm.generate(requests, GREEDY, use_tqdm=False)
    assert_tokens(outputs, expected)
    pads = videos.video_positions(preset, expected[0][0])
    # Two pairs of frames of 3x4 soft tokens, 12 tokens apart or more.
    assert len(pads) == 24 and pads[-1] - pads[0] > STEP_TOKENS
    assert len(videos.video_positions(preset, expected[3][0])) == 36
    assert expected[0][1] != expected[3][1]
    support_matrix.record(ROW, "Qwen3_5Backbone", video="pass")


def test_a_video_over_the_token_budget_is_refused(llm):
    """64 frames are 32 timestamped pairs: more markers and timestamps than
    the 32 frames vLLM's loader keeps (as `serve` sets it) take; refused,
    and the engine serves on."""
    video = videos.random_video(3, frames=64, stride=1)
    with pytest.raises(ValueError, match="more than the 320 a video may take"):
        llm.generate([videos.request(f"{VIDEO} what?", video=video)], GREEDY, use_tqdm=False)
    output = llm.generate(["Hello there"], GREEDY, use_tqdm=False)
    assert len(output[0].outputs[0].token_ids) == MAX_NEW_TOKENS
