"""Our torch custom ops, in the `vllm_keras_hub` namespace.

A step that must do per-request Python work (a state layer's own `call`, a
second attention call over image rows) runs it inside an op, which
torch.compile keeps opaque, as vLLM's own attention ops are.
"""

from torch.library import Library
from vllm.utils.torch_utils import direct_register_custom_op

# Each op lives as long as the library object it was registered with.
_LIBRARIES = []


def register_output_op(name, func):
    """Registers `torch.ops.vllm_keras_hub.<name>`, writing into `output`.

    Args:
        name: The op's name.
        func: `(input, output, layer_name) -> None`; it fills `output` in
            place (its compiled stand-in does nothing).
    """
    library = Library("vllm_keras_hub", "FRAGMENT")
    direct_register_custom_op(
        op_name=name,
        op_func=func,
        mutates_args=["output"],
        fake_impl=lambda *args: None,
        target_lib=library,
    )
    _LIBRARIES.append(library)


def register_functional_op(name, func, fake):
    """Registers `torch.ops.vllm_keras_hub.<name>`, returning a new tensor."""
    library = Library("vllm_keras_hub", "FRAGMENT")
    direct_register_custom_op(
        op_name=name, op_func=func, mutates_args=[], fake_impl=fake, target_lib=library
    )
    _LIBRARIES.append(library)
