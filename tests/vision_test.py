"""Images served through vLLM's multimodal API: a Gemma3 preset with a vision encoder.

The oracle is the preset's own `generate()` with images
(`image_oracle.keras_hub_greedy_with_images`). The tiny preset's image embeddings
are strong enough that different images, and attending within an image
causally instead of bidirectionally, change the tokens.
"""

import subprocess
import sys

import pytest
from vllm import SamplingParams

from vllm_keras_hub.entrypoints.llm import KerasHubLLM
from vllm_keras_hub.layers.attention import image_attention
from vllm_keras_hub.settings import UnsupportedImageServingError
from vllm_keras_hub.testing import support_matrix
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.image_oracle import keras_hub_greedy_with_images
from vllm_keras_hub.testing.images import IMAGES
from vllm_keras_hub.testing.images import (
    assert_the_second_hits_the_prefix_cache_inside_the_image,
)
from vllm_keras_hub.testing.images import assert_tokens
from vllm_keras_hub.testing.images import image_positions
from vllm_keras_hub.testing.images import request
from vllm_keras_hub.testing.images import same_image_twice
from vllm_keras_hub.testing.user_env import user_env
from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

MAX_NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
ENGINE = dict(limit_mm_per_prompt={"image": 2}, block_size=16)
# This preset's row of the support matrix.
ROW = "gemma3 + vision encoder"

# (text, images): 0, 1 and 2 images in one batch.
PROMPTS = [
    ("a <start_of_image> caption", [IMAGES[0]]),
    ("Hello there", []),
    ("two <start_of_image> and <start_of_image> compared", [IMAGES[1], IMAGES[2]]),
    ("a <start_of_image> caption", [IMAGES[1]]),
    # The expansion's newlines merge with the prompt's ("\n\n\n" is a token).
    ("Look:\n<start_of_image>\nWhat is it?", [IMAGES[2]]),
]


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return build_tiny_vision_preset(str(tmp_path_factory.mktemp("gemma3_vision")))


@pytest.fixture(scope="module")
def expected(preset):
    return keras_hub_greedy_with_images(preset, PROMPTS, MAX_NEW_TOKENS)


# In-process engines share the process's distributed state, which closing
# one tears down: the tests of this engine come before those starting
# their own.
@pytest.fixture(scope="module")
def llm(preset):
    with in_process_llm(f"keras_hub:{preset}", enable_prefix_caching=True, **ENGINE) as llm:
        yield llm


def test_images_in_a_batch_match_generate(llm, expected):
    support_matrix.record(ROW, "Gemma3Backbone", images="FAIL")
    outputs = llm.generate([request(*p) for p in PROMPTS], GREEDY, use_tqdm=False)
    assert_tokens(outputs, expected)
    support_matrix.record(ROW, "Gemma3Backbone", images="pass")
    # The image decides the answer: the same text, another image.
    assert expected[0][1] != expected[3][1]


def test_the_same_image_again_is_served_from_the_prefix_cache(llm, preset):
    """The cached blocks end inside the image: its last tokens attend again."""
    prompts = same_image_twice("<start_of_image>")
    expected = keras_hub_greedy_with_images(preset, prompts, MAX_NEW_TOKENS)
    assert_the_second_hits_the_prefix_cache_inside_the_image(
        llm, preset, prompts, expected, GREEDY
    )


def test_an_image_past_the_sliding_window(llm, preset):
    """Images ending past the window (128 tokens): their rows see keys back
    to the window's edge only, and those of a later block of the cache.
    Without the window, the first prompt's tokens differ (checked by hand)."""
    prompts = [
        (" ".join(["word"] * 110) + " <start_of_image> caption", [IMAGES[0]]),
        (" ".join(["cat"] * 95) + " <start_of_image> and <start_of_image> ok", IMAGES[1:]),
    ]
    expected = keras_hub_greedy_with_images(preset, prompts, MAX_NEW_TOKENS)
    assert all(image_positions(preset, ids)[-1] >= 128 for ids, _ in expected)
    outputs = llm.generate([request(*p) for p in prompts], GREEDY, use_tqdm=False)
    assert_tokens(outputs, expected)


def test_causal_attention_over_images_would_be_wrong(llm, expected, monkeypatch):
    """Without the second, bidirectional pass the tokens differ."""
    # Eager: the engine looks the function up at every step. The prefix
    # cache is emptied before and after, so no block computed one way is
    # read the other.
    monkeypatch.setattr(image_attention, "attend_images", lambda a, q, output: output)
    llm.reset_prefix_cache()
    outputs = llm.generate([request(*p) for p in PROMPTS], GREEDY, use_tqdm=False)
    monkeypatch.undo()
    assert llm.reset_prefix_cache()
    served = [list(o.outputs[0].token_ids) for o in outputs]
    assert served != [tokens for _, tokens in expected]


def test_compiled_with_chunked_prefill_an_image_is_never_split(preset, expected):
    """vLLM's default compiled mode, with 32 tokens a step, which would cut
    images: each image is computed in one step, and the image attention
    runs inside the compiled graph as its custom op.

    Last, a prefix-cache hit that ends inside an image, in a step whose
    budget another prompt has nearly used up: vLLM's own scheduler would
    compute part of the image's rest there (`scheduler.py`).
    """
    resumed = same_image_twice("<start_of_image>")
    resumed_expected = keras_hub_greedy_with_images(preset, resumed, MAX_NEW_TOKENS)
    with in_process_llm(
        f"keras_hub:{preset}",
        enforce_eager=False,
        max_num_batched_tokens=32,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        **ENGINE,
    ) as llm:
        outputs = llm.generate([request(*p) for p in PROMPTS], GREEDY, use_tqdm=False)
        assert served_model(llm).compiled or served_model(
            llm
        ).was_aot_compile_fn_loaded_from_disk
        (first,) = llm.generate([request(*resumed[0])], GREEDY, use_tqdm=False)
        # 27 tokens first, so 5 of the step's 32 are left when the second
        # prompt resumes at its cached block's end (token 16), inside its image.
        filler = {"prompt_token_ids": [2] + [300] * 26}
        _, second = llm.generate(
            [filler, request(*resumed[1])], GREEDY, use_tqdm=False
        )
    assert_tokens(outputs, expected)
    # The second image of the third prompt straddles a 32-token step.
    positions = image_positions(preset, expected[2][0])[16:]
    assert positions[0] // 32 != positions[-1] // 32
    assert_tokens([first, second], resumed_expected)
    positions = image_positions(preset, resumed_expected[1][0])
    assert positions[0] < second.num_cached_tokens < positions[-1] - 5


@pytest.mark.parametrize(
    "settings, cause",
    [
        (dict(disable_chunked_mm_input=False), "--disable-chunked-mm-input"),
        (
            dict(scheduler_cls="vllm.v1.core.sched.scheduler.Scheduler"),
            "--scheduler-cls vllm_keras_hub.scheduler.ImageScheduler",
        ),
    ],
    ids=["chunked-images", "vllm-scheduler"],
)
def test_settings_that_could_split_an_image_are_refused_at_start_up(
    preset, settings, cause
):
    with pytest.raises(UnsupportedImageServingError, match=cause):
        KerasHubLLM(f"keras_hub:{preset}", **settings)


def test_precomputed_embeddings_are_refused_at_start_up(preset):
    with pytest.raises(UnsupportedImageServingError, match="--enable-mm-embeds"):
        KerasHubLLM(f"keras_hub:{preset}", enable_mm_embeds=True)


def test_the_model_classes_import_in_a_fresh_shell():
    """Plain `vllm` imports a class in its front end, with no
    `KERAS_BACKEND` set (`export` prints that command): each of the
    registered classes, the families' own among them."""
    env = user_env()
    assert "KERAS_BACKEND" not in env
    script = (
        "from vllm.utils.import_utils import resolve_obj_by_qualname as r\n"
        "from vllm_keras_hub.export.architectures import CLASSES\n"
        "for path in CLASSES.values(): r(path.replace(':', '.'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
