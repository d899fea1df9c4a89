"""Decoder blocks that multiply by their MLP kernels themselves.

Gemma4's decoder block does not call its feed-forward layers: it reads their
kernels (`ops.matmul(x, self.gating_ffw.kernel)`, a KerasHub workaround for
a graph-tracer bug). No vLLM layer can stand under those calls: tensor
parallelism slices the kernels in place (`parallel_mlp.py`), and LoRA
adapters per request leave those layers out (`lora_linear.py`).
"""

# Decoder block class -> (its gate and up projections, its down projection).
BLOCKS = {
    "Gemma4TextDecoderBlock": (("gating_ffw", "gating_ffw_2"), "ffw_linear"),
}


def reads_kernels(block):
    """Whether `block` multiplies by its MLP's kernels itself."""
    return type(block).__name__ in BLOCKS


def kernel_read_layers(model):
    """The ids of `model`'s layers whose kernels their block multiplies by."""
    found = set()
    for block in model._flatten_layers(include_self=False):
        if reads_kernels(block):
            columns, row = BLOCKS[type(block).__name__]
            found.update(id(getattr(block, name)) for name in (*columns, row))
    return found
