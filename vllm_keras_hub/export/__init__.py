"""A KerasHub preset as a model folder vLLM opens: config, tokenizer, chat template, sampling, image format. No weights."""
