"""What hands a KerasHub model's heavy ops to vLLM's layers and kernels.

By kind, as vLLM's own `model_executor/layers/`: `attention/`, `moe/`,
`state/`, `linear/`, `parallel/`; and what they share: the step context
(`step.py`), the custom ops (`custom_ops.py`), and what EAGLE-3 drafters
read (`eagle3.py`).
"""
