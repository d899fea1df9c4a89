"""BART: an encoder-decoder, served as its `Seq2SeqLM` (`tasks/seq_2_seq_lm/`)."""

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS

FAMILY = Family("bart", "BART", "BartBackbone", OURS, seq2seq="BartSeq2SeqLM")
