"""What hands a KerasHub model's heavy ops to vLLM's layers and kernels."""
