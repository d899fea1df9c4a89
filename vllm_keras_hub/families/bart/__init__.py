"""BART: an encoder-decoder, served as its `Seq2SeqLM` (`tasks/seq_2_seq_lm/`).

Its parts beyond this row: `seq2seq.py`, what its model folder records and
how its decoder's attention reaches vLLM.
"""

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS


def decoder_attention(backbone):
    # keras-hub's `TransformerDecoder` layers, each with its own
    # self-attention and cross-attention (`CachedMultiHeadAttention`).
    return [
        (layer._self_attention_layer, layer._cross_attention_layer)
        for layer in backbone.decoder_transformer_layers
    ]


FAMILY = Family(
    "bart",
    "BART",
    "BartBackbone",
    OURS,
    seq2seq="BartSeq2SeqLM",
    decoder_attention=decoder_attention,
)
