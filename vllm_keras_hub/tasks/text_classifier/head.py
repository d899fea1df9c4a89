"""A classifier preset's own head, on the pooled first-token states vLLM hands it."""

# First: keras-hub imports Keras, on torch.
from vllm_keras_hub import keras_on_torch  # noqa: F401
import keras
import keras_hub
import torch
from keras.src.backend.torch.core import to_torch_dtype
from keras_hub.src.utils.preset_utils import TASK_WEIGHTS_FILE
from torch import nn


def build_task(preset, backbone, spec):
    """The preset's `TextClassifier` over `backbone`, its own weights loaded.

    The class's `__init__` builds its head layers and wires them after the
    backbone's graph, as `from_preset` does, but on the backbone this
    model already holds (built, not yet loaded: the head's graph needs only
    its shapes). Only the head's weights are read, from `task.weights.h5`
    (`Task.load_task_weights`); the backbone's come with it, once.

    Args:
        preset: A `Preset`.
        backbone: The backbone served, from `unloaded_backbone`.
        spec: The preset's `Classifier` fields (`spec.py`).
    """
    options = dict(preset.task_config["config"])
    for key in ("backbone", "preprocessor"):
        options.pop(key, None)
    task_cls = getattr(keras_hub.models, spec["task"])
    # Wiring the graph calls the backbone on symbolic inputs, which reads
    # each variable for its shape. An unloaded variable's read calls its
    # initializer, which fails until the preset gives it its value
    # (`loading/preset_weights.py`); while the graph is wired, it gives a
    # zero-strided stand-in of the variable's shape instead, holding no
    # memory. The head's own variables are made and initialized as usual.
    guards = {id(v): v._initializer for v in backbone.variables}

    def stand_in(shape, dtype=None):
        return torch.zeros((), dtype=to_torch_dtype(dtype)).expand(tuple(shape))

    for variable in backbone.variables:
        variable._initializer = stand_in
    try:
        task = task_cls(backbone=backbone, preprocessor=None, **options)
    finally:
        for variable in backbone.variables:
            variable._initializer = guards[id(variable)]
    task.load_task_weights(preset.path(TASK_WEIGHTS_FILE))
    return task


class Head(nn.Module):
    """The head's layers, as vLLM's classify pooler calls its classifier.

    The last layer's activation is vLLM's to apply (`spec.py`): it is
    taken off, on this model's own copy of the task.

    Args:
        task: What `build_task` returned.
        layers: `Classifier.head`: `(owner, name)` of each layer, in order.
    """

    def __init__(self, task, layers):
        super().__init__()
        owners = {"backbone": task.backbone, "task": task}
        # A list, not a `ModuleList`: the layers' weights are the preset's,
        # already loaded; vLLM must not see them as its own to load.
        self.__dict__["layers"] = [owners[owner].get_layer(name) for owner, name in layers]
        self.layers[-1].activation = keras.activations.linear

    def forward(self, pooled):
        for layer in self.layers:
            pooled = layer(pooled)
        return pooled
