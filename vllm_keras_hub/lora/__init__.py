"""KerasHub LoRA adapters: merged at load, or chosen per request."""
