"""vLLM's oneDNN GEMM as a functional op, for compiled graphs.

vLLM's `onednn_mm` writes into an output it allocates first
(`torch.ops._C.onednn_mm` mutates its first argument). torch.compile
records each such call as a functionalized mutation, which AOTAutograd and
Inductor then analyse and take apart again, for every matmul of the graph
(SmolLM2, float32, 210 matmuls: Inductor's post-grad passes took 13.8 s of
a 190 s compile, 2.1 s with this op). The same kernel, on the same prepacked
weight, behind an op that returns its output is one plain node.
"""

import torch

from vllm_keras_hub.layers.custom_ops import register_functional_op


def functional(cpu_linear):
    """`cpu_linear`'s GEMM as a functional op, where it is vLLM's oneDNN one.

    Args:
        cpu_linear: What vLLM's `dispatch_cpu_unquantized_gemm` set as a
            layer's `cpu_linear`.

    Returns:
        `matmul(rows)`, or `None` where the dispatch chose another kernel.
    """
    found = handler(cpu_linear)
    return None if found is None else _FunctionalGemm(found)


def handler(cpu_linear):
    """The oneDNN handler vLLM's dispatch bound into `cpu_linear`, if any."""
    from vllm._custom_ops import CPUDNNLGEMMHandler

    for cell in getattr(cpu_linear, "__closure__", None) or ():
        if isinstance(cell.cell_contents, CPUDNNLGEMMHandler):
            return cell.cell_contents
    return None


class _FunctionalGemm:
    """`rows @ W` for one weight vLLM's oneDNN handler holds prepacked."""

    def __init__(self, handler):
        # The handler frees vLLM's oneDNN primitive when it is collected.
        self.handler = handler
        self.handler_tensor = handler.handler_tensor
        self.n = handler.n

    def __call__(self, x):
        return torch.ops.vllm_keras_hub.onednn_linear(x, self.handler_tensor, self.n)


def _onednn_linear(x: torch.Tensor, handler_tensor: torch.Tensor, n: int) -> torch.Tensor:
    output = torch.empty((x.shape[0], n), dtype=x.dtype)
    torch.ops._C.onednn_mm(output, x, None, handler_tensor)
    return output


def _onednn_linear_fake(x, handler_tensor, n):
    return x.new_empty((x.shape[0], n))


register_functional_op("onednn_linear", _onednn_linear, _onednn_linear_fake)
