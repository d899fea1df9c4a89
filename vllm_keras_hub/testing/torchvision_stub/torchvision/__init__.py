"""An empty stand-in for torchvision, for vLLM's native Qwen3.5 in tests only.

vLLM 0.32's `models/qwen3_5.py` imports transformers' Qwen2-VL image
processor, which imports torchvision, even for text. torchvision breaks
`import torch` with this CPU build, so it is never installed. With this
folder's parent on `PYTHONPATH`, those imports succeed; text-only serving
calls none of it (every function here raises). Only the processes that run
vLLM's native Qwen3.5 for a cross-check or a benchmark get it.
"""

__version__ = "0.28.0"
