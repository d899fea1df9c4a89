"""The vLLM model classes that run a preset's own KerasHub layers."""
