import os

# Before anything imports keras: the served layers run on torch.
os.environ.setdefault("KERAS_BACKEND", "torch")
# A small fixed KV cache for every test engine (GiB of RAM on CPU), so engines
# fit side by side on a 24 GiB machine.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
