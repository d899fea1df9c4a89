"""A KerasHub preset as a model folder vLLM opens. No weights.

The folder's config, tokenizer, chat template, sampling and image format.
"""
