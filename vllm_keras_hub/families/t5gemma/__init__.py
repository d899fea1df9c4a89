"""T5Gemma: an encoder-decoder, served as its `Seq2SeqLM` (`tasks/seq_2_seq_lm/`).

Its parts beyond this row: `seq2seq.py`, what its model folder records and
how its decoder's attention and logits reach vLLM.
"""

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS


def decoder_attention(backbone):
    # Each `T5GemmaDecoderLayer`'s two `T5GemmaAttention` layers.
    return [(layer.self_attn, layer.cross_attn) for layer in backbone.decoder_layers]


FAMILY = Family(
    "t5gemma",
    "T5Gemma",
    "T5GemmaBackbone",
    OURS,
    seq2seq="T5GemmaSeq2SeqLM",
    decoder_attention=decoder_attention,
)
