"""The ways in: `KerasHubLLM` and the `vllm-keras-hub` command."""
