"""Which rows of a step are image tokens, and the context each attends.

The kernel call itself is proven against Gemma3's `generate()` in
`vision_test.py`.
"""

import pytest
import torch

from vllm_keras_hub.layers.image_attention import ImageSplitError
from vllm_keras_hub.layers.image_attention import image_spans


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
