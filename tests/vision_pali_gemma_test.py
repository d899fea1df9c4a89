"""PaliGemma served with its images: a prefix LM.

The oracle is the preset's own `generate()` through its own preprocessor,
each prompt alone (`image_oracle.pali_gemma_greedy`). The tiny preset's
image decides its tokens, and so does attending over the prompt both ways
(`test_causal_attention_over_the_prefix_would_be_wrong`), also beside the
image (`test_both_ways_over_the_image_alone_would_be_wrong`).
"""

import collections

import pytest
import torch
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from vllm_keras_hub.entrypoints.llm import KerasHubLLM
from vllm_keras_hub.layers.attention import image_attention
from vllm_keras_hub.parallel_settings import UnsupportedParallelismError
from vllm_keras_hub.settings import UnsupportedImageServingError
from vllm_keras_hub.testing import support_matrix
from vllm_keras_hub.testing.engines import in_process_engine_env
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.image_oracle import pali_gemma_greedy
from vllm_keras_hub.testing.images import assert_tokens
from vllm_keras_hub.testing.images import image_data_url
from vllm_keras_hub.testing.images import IMAGES
from vllm_keras_hub.testing.images import random_image
from vllm_keras_hub.testing.vision_presets import build_tiny_pali_gemma_preset
from vllm_keras_hub.testing.vision_presets import PALI_GEMMA_2

MAX_NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
# A step holds the longest prompt (`image_settings`): with 128 tokens, the
# batch below takes several steps, prefills beside decodes.
ENGINE = dict(max_model_len=128, block_size=32)
ROW = "pali_gemma"
BACKBONE = "PaliGemmaBackbone"
IMAGE_ROWS = 16

LONG = "answer en " + " ".join(["where is the small cat sitting now"] * 5) + "?\n"
PROMPTS = [
    ("caption en\n", IMAGES[0]),
    ("caption en\n", IMAGES[1]),
    ("answer en where is the cat sitting?\n", IMAGES[2]),
    (LONG, IMAGES[0]),
    ("the quick brown fox", IMAGES[1]),
]


def request(text, image):
    return {"prompt": text, "multi_modal_data": {"image": image}}


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return build_tiny_pali_gemma_preset(str(tmp_path_factory.mktemp("pali_gemma")))


@pytest.fixture(scope="module")
def expected(preset):
    return pali_gemma_greedy(preset, PROMPTS, MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def llm(preset):
    with in_process_llm(f"keras_hub:{preset}", enable_prefix_caching=True, **ENGINE) as llm:
        yield llm


def served_prompt(expected_prompt, image_id):
    """The engine's prompt: the image's rows, then the oracle's ids."""
    return [image_id] * IMAGE_ROWS + expected_prompt


def test_prompts_with_images_in_a_batch_match_generate(llm, preset, expected):
    support_matrix.record(ROW, BACKBONE, batched="FAIL", images="FAIL")
    outputs = llm.generate([request(*p) for p in PROMPTS], GREEDY, use_tqdm=False)
    image_id = outputs[0].prompt_token_ids[0]
    assert_tokens(
        outputs, [(served_prompt(ids, image_id), tokens) for ids, tokens in expected]
    )
    support_matrix.record(ROW, BACKBONE, batched="pass", images="pass")
    # The image decides the answer: the same text, another image.
    assert expected[0][1] != expected[1][1]
    # A step of 128 tokens holds the long prompt alone.
    assert len(outputs[3].prompt_token_ids) > 64


def test_a_prefix_cache_hit_needs_the_same_image_and_prompt(llm, preset):
    """A prefix's keys and values depend on all of it: the same prompt again
    hits the cache, one that differs only at its end, or only in its image,
    does not."""
    image = random_image(5)
    same = request(LONG, image)
    other_end = request(LONG[:-2] + "!\n", image)
    other_image = request(LONG, random_image(6))
    prompts = [(LONG, image), (LONG[:-2] + "!\n", image), (LONG, random_image(6))]
    expected = pali_gemma_greedy(preset, prompts, MAX_NEW_TOKENS)
    llm.reset_prefix_cache()
    first = llm.generate([same], GREEDY, use_tqdm=False)[0]
    again, ends, images = (
        llm.generate([p], GREEDY, use_tqdm=False)[0] for p in (same, other_end, other_image)
    )
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens >= 32
    assert ends.num_cached_tokens == 0 and images.num_cached_tokens == 0
    for output, (_, tokens) in zip([again, ends, images], expected, strict=True):
        assert list(output.outputs[0].token_ids) == tokens
    support_matrix.record(ROW, BACKBONE, prefix_cache="pass")


def test_a_chat_message_with_an_image(llm, preset):
    """`LLM.chat`: the image part goes first, the text ends in a newline."""
    (prompt_ids, tokens), = pali_gemma_greedy(preset, [("caption en\n", IMAGES[2])], 8)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image_data_url(IMAGES[2])}},
                {"type": "text", "text": "caption en"},
            ],
        }
    ]
    output = llm.chat(messages, GREEDY, use_tqdm=False)[0]
    assert output.prompt_token_ids[IMAGE_ROWS:] == prompt_ids
    assert list(output.outputs[0].token_ids) == tokens


def test_prompts_without_one_image_are_refused_and_the_engine_serves_on(
    llm, expected
):
    with pytest.raises(VLLMValidationError, match="send exactly one image"):
        llm.generate(["caption en\n"], GREEDY, use_tqdm=False)
    with pytest.raises(VLLMValidationError, match="At most 1 image"):
        llm.generate(
            [{"prompt": "x", "multi_modal_data": {"image": IMAGES[:2]}}], GREEDY, use_tqdm=False
        )
    output = llm.generate([request(*PROMPTS[0])], GREEDY, use_tqdm=False)[0]
    assert list(output.outputs[0].token_ids) == expected[0][1]


def test_causal_attention_over_the_prefix_would_be_wrong(llm, expected, monkeypatch):
    """Without the second, bidirectional pass over each prefix the tokens
    differ."""
    monkeypatch.setattr(image_attention, "attend_images", lambda a, q, output: output)
    llm.reset_prefix_cache()
    outputs = llm.generate([request(*p) for p in PROMPTS], GREEDY, use_tqdm=False)
    monkeypatch.undo()
    assert llm.reset_prefix_cache()
    served = [list(o.outputs[0].token_ids) for o in outputs]
    assert served != [tokens for _, tokens in expected]


def test_both_ways_over_the_image_alone_would_be_wrong(llm, expected, monkeypatch):
    """With only the image's rows attending both ways (vLLM's own PaliGemma's
    `is_mm_prefix_lm` ranges) and the prompt's text causally, the tokens
    differ: the served prefix is the image and the prompt, both ways."""
    model = served_model(llm)
    image_id = llm.get_tokenizer().get_vocab()["<image>"]
    # The image attention then takes the `<image>` rows alone
    # (`embed_input_ids` in `models/images.py`).
    monkeypatch.setattr(model, "_image_token_ids", torch.tensor([image_id]))
    before = collections.Counter(image_attention.ATTENDED_ROWS)
    llm.reset_prefix_cache()
    outputs = llm.generate([request(*p) for p in PROMPTS], GREEDY, use_tqdm=False)
    monkeypatch.undo()
    assert llm.reset_prefix_cache()
    attended = image_attention.ATTENDED_ROWS - before
    assert attended and set(attended.values()) == {IMAGE_ROWS * len(PROMPTS)}
    served = [list(o.outputs[0].token_ids) for o in outputs]
    assert served != [tokens for _, tokens in expected]


def test_pali_gemma_2_prefixes_past_the_sliding_window(tmp_path):
    """PaliGemma 2's decoder (Gemma 2's post-norms, soft caps, and a 32-token
    window here on every other layer): prefixes of 24 to 109 tokens, the
    longer ones past the window, whose rows attend both ways within it."""
    preset = build_tiny_pali_gemma_preset(str(tmp_path / "pali_gemma_2"), version=2)
    expected = pali_gemma_greedy(preset, PROMPTS, MAX_NEW_TOKENS)
    with in_process_llm(f"keras_hub:{preset}", **ENGINE) as llm:
        outputs = llm.generate([request(*p) for p in PROMPTS], GREEDY, use_tqdm=False)
    image_id = outputs[0].prompt_token_ids[0]
    assert_tokens(
        outputs, [(served_prompt(ids, image_id), tokens) for ids, tokens in expected]
    )
    assert len(outputs[3].prompt_token_ids) > 3 * PALI_GEMMA_2["sliding_window_size"]
    support_matrix.record(ROW, BACKBONE, window=True, soft_cap=True)


def test_compiled_prompts_in_a_small_step_budget(preset, expected):
    """vLLM's default compiled mode, the image attention inside the graph as
    its custom op; 64 tokens a step, so the batch's prompts are computed in
    several steps, each prompt whole, beside the others' decodes."""
    prompts = [p for p in PROMPTS if len(p[0]) < 40]
    wanted = [e for p, e in zip(PROMPTS, expected, strict=True) if len(p[0]) < 40]
    with in_process_llm(
        f"keras_hub:{preset}",
        max_model_len=64,
        max_num_batched_tokens=64,
        block_size=32,
        enforce_eager=False,
    ) as llm:
        outputs = llm.generate([request(*p) for p in prompts], GREEDY, use_tqdm=False)
    image_id = outputs[0].prompt_token_ids[0]
    assert_tokens(outputs, [(served_prompt(ids, image_id), tokens) for ids, tokens in wanted])
    # Never chunked: a prefix attends both ways, so each is computed whole.
    support_matrix.record(ROW, BACKBONE, chunked="never split", compiled="pass")


@pytest.mark.parametrize(
    "settings, error, cause",
    [
        (dict(limit_mm_per_prompt={"image": 0}), UnsupportedImageServingError, "text-only"),
        (
            dict(max_model_len=128, max_num_batched_tokens=64),
            UnsupportedImageServingError,
            "--max-num-batched-tokens 128",
        ),
        (dict(pipeline_parallel_size=2), UnsupportedParallelismError, "pipeline stages"),
        (dict(enable_lora=True), UnsupportedImageServingError, "LoRA adapters"),
        # n-gram drafts: model drafters are refused for every image target
        # first (`speculative.check`).
        (
            dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2}),
            UnsupportedImageServingError,
            "without speculative decoding",
        ),
    ],
)
def test_settings_that_would_cut_a_prompt_are_refused_at_start_up(
    preset, settings, error, cause
):
    with in_process_engine_env(), pytest.raises(error, match=cause):
        KerasHubLLM(f"keras_hub:{preset}", **settings)
    if settings.get("pipeline_parallel_size"):
        support_matrix.record_refusal("PaliGemmaBackbone", "pp2")


def test_the_published_layout_and_a_bare_one_export_alike(preset, tmp_path):
    """A published preset carries its preprocessor; one saved without it
    (tokenizer and image converter alone) gives the same model folder."""
    import json

    from vllm_keras_hub.export.preset_folder import write_model_folder

    bare = build_tiny_pali_gemma_preset(str(tmp_path / "bare"), preprocessor=False)
    configs = []
    for index, source in enumerate((preset, bare)):
        folder = tmp_path / f"folder_{index}"
        folder.mkdir()
        assert write_model_folder(source, str(folder)) == "keras_hub_image_first"
        config = json.loads((folder / "config.json").read_text())
        configs.append({k: v for k, v in config.items() if k != "keras_hub_preset"})
    assert configs[0] == configs[1]
    assert configs[0]["keras_hub_image"]["image_token"] == "<image>"
