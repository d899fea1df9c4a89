"""KerasHub `Seq2SeqLM` presets on vLLM's encoder-decoder runner (BART, T5Gemma).

`spec.py` writes the model folder vLLM reads (an encoder-decoder config, the
preset's own sampler as the default), `processor.py` takes each request's
encoder text, and `model.py` serves the preset's own encoder and decoder
layers on vLLM's attention and cross-attention kernels.
"""

ARCHITECTURE = "KerasHubTorchForConditionalGeneration"
MODEL_CLASS = "vllm_keras_hub.tasks.seq_2_seq_lm.model:KerasHubForConditionalGeneration"
# The `config.json` key holding what the model class and processor read.
FIELD = "keras_hub_seq2seq"
