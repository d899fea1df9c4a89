"""Which rows of a step are image tokens, and the context each attends.

The kernel call itself is proven against Gemma3's `generate()` in
`vision_test.py`. The step's fields are stand-ins here for the three of
vLLM's forward context these functions read.
"""

import types

import pytest
import torch

from vllm_keras_hub.layers.attention.image_attention import image_spans
from vllm_keras_hub.layers.attention.image_attention import ImageMaskError
from vllm_keras_hub.layers.attention.image_attention import ImageSplitError
from vllm_keras_hub.layers.attention.image_attention import set_step
from vllm_keras_hub.layers.attention.image_attention import step_spans


def spans(flags, query_start_loc, seq_lens):
    return image_spans(
        torch.tensor(flags, dtype=torch.bool),
        torch.tensor(query_start_loc),
        torch.tensor(seq_lens),
    )


def test_each_image_attends_up_to_its_own_end():
    # Request 0: a whole prompt of 8 tokens, images at rows 1-2 and 4-5.
    # Request 1: a decode. Request 2: the last 4 tokens of a 20-token
    # prompt (16 computed before), the rest of an image at rows 9-10.
    flags = [0, 1, 1, 0, 1, 1, 0, 0] + [0] + [1, 1, 0, 0]
    found = spans(flags, [0, 8, 9, 13], [8, 30, 20])
    assert found == [(0, 1, 3, 3), (0, 4, 6, 6), (2, 9, 11, 18)]


def test_no_image_no_span():
    assert spans([0, 0, 0], [0, 2, 3], [2, 9]) == []


def test_an_image_cut_at_the_end_of_its_step_is_refused():
    with pytest.raises(ImageSplitError, match="--scheduler-cls"):
        spans([0, 1, 1, 1], [0, 4], [4])


def test_a_prefix_spans_its_whole_prompt():
    # PaliGemma: request 0's prompt of 6 (image and text) in one step, then
    # request 1's decode after a prompt of 4, then request 2's prompt whole.
    flags = torch.tensor([1] * 6 + [0] + [1] * 3, dtype=torch.bool)
    found = image_spans(
        flags, torch.tensor([0, 6, 7, 10]), torch.tensor([6, 5, 3]), spans_end_prompts=True
    )
    assert found == [(0, 0, 6, 6), (2, 7, 10, 3)]


def _context(num_tokens):
    """The fields of vLLM's forward context the image rows are read from."""
    metadata = types.SimpleNamespace(
        num_actual_tokens=num_tokens,
        query_start_loc=torch.tensor([0, num_tokens]),
        seq_lens=torch.tensor([num_tokens]),
    )
    return types.SimpleNamespace(attn_metadata={"layer": metadata})


def test_a_mask_that_does_not_fit_its_step_is_refused():
    """Never the causal output instead: a step whose mask was set for it
    but whose token count differs stops the engine."""
    set_step(torch.tensor([False, True, True, False]))
    with pytest.raises(ImageMaskError, match="4 flags for 5 tokens"):
        step_spans(_context(5), "layer")


def test_runs_vllm_does_not_embed_carry_no_images():
    """vLLM's warm-up and profiling runs never call `embed_input_ids`, so
    no mask is set for them: the last real step's is not theirs."""
    set_step(torch.tensor([False, True, True, False]))
    real = _context(4)
    assert step_spans(real, "layer") == [(0, 1, 3, 3)]
    assert step_spans(real, "layer") == [(0, 1, 3, 3)]
    assert step_spans(_context(4), "layer") == []
    assert step_spans(_context(7), "layer") == []
    set_step(None)
    assert step_spans(_context(4), "layer") == []
