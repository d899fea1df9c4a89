"""Every KerasHub task served by vLLM's pooling runner, one module or folder each.

(`seq_2_seq_lm/` and `audio_to_text/`, the encoder-decoder tasks, generate
and have no row here: their families name them, `Family.seq2seq` and
`Family.audio_to_text`.)

A task's module (`tasks/<name>.py`, or its folder `tasks/<name>/`) holds its
`PoolingTask` row, found here when this table is imported: adding a task
adds its own files and touches none of the shared ones. The row names the
rest by module path, as the plugin registers model classes, so reading the
table imports neither Keras nor KerasHub (`plugin.py` reads it in every
vLLM process).

What the shared steps ask of a task:
- its reader, `reader(preset, family, backbone_config)`, returns the
  preset's `spec`, or `None` for a preset that is not this task, and
  raises `PoolingTaskError` naming the cause for one it cannot serve;
- the spec has `task` (the KerasHub task class name) and `start_token`
  (whether its preprocessor packs one before each text; the end token
  always follows), `config_fields()` (the model folder's `config.json`
  fields: `architectures`, and the row's `field` holding what the model
  class reads), `write_files(directory)` (the files vLLM reads beside it,
  such as sentence-transformers' pooling files) and
  `length_limits(sentence_config)` (the longest texts served, each with
  its reason).

`export/preset_folder.py` writes the folder, `settings.py` refuses the
engine settings no pooling model is served with, and the KerasHub
tokenizer mode packs texts as the spec says.
"""

import dataclasses
import importlib
import pkgutil


class PoolingTaskError(ValueError):
    """A preset of a pooling task that cannot be served, naming the cause."""


@dataclasses.dataclass(frozen=True)
class PoolingTask:
    """A KerasHub task served by vLLM's pooling runner.

    Args:
        name: Its module's name under `tasks/`.
        field: The `config.json` key that holds its spec's fields.
        architecture: Our vLLM model class's registered name.
        model_class: `"module:Class"`, that class.
        reader: `"module:function"`, its reader (see the module docstring).
        endpoint: Where vLLM serves it, for messages (`"/v1/embeddings"`).
        former_architectures: Names older folders carry for the class.
    """

    name: str
    field: str
    architecture: str
    model_class: str
    reader: str
    endpoint: str
    former_architectures: tuple[str, ...] = ()

    def read(self, preset, family, backbone_config):
        """The preset's spec for this task, or `None` (see `reader`)."""
        module, _, function = self.reader.partition(":")
        return getattr(importlib.import_module(module), function)(
            preset, family, backbone_config
        )


def _discover():
    tasks = []
    for module in pkgutil.iter_modules(__path__):
        if module.name.endswith("_test"):
            continue
        task = getattr(importlib.import_module(f"{__name__}.{module.name}"), "TASK", None)
        if task is not None:
            tasks.append(task)
    return tuple(sorted(tasks, key=lambda task: task.name))


def _check(tasks):
    for kind in ("name", "field", "architecture"):
        values = [getattr(task, kind) for task in tasks]
        if len(set(values)) != len(values):
            raise ValueError(f"Two pooling tasks share a {kind}: {sorted(values)}.")
    for task in tasks:
        for reference in (task.model_class, task.reader):
            if reference.count(":") != 1:
                raise ValueError(f"{task.name}: {reference!r} is not 'module:name'.")


POOLING_TASKS = _discover()
_check(POOLING_TASKS)
# What the plugin registers: our class name -> "module:Class".
CLASSES = {task.architecture: task.model_class for task in POOLING_TASKS}
FORMER = {
    former: task.architecture
    for task in POOLING_TASKS
    for former in task.former_architectures
}


def read(preset, family, backbone_config):
    """The pooling task and spec `preset` is served as, or `(None, None)`.

    Raises:
        PoolingTaskError: a task recognizes the preset but cannot serve it.
    """
    for task in POOLING_TASKS:
        spec = task.read(preset, family, backbone_config)
        if spec is not None:
            return task, spec
    return None, None


def of_config(config):
    """The pooling task of a model folder's config, and its fields.

    Args:
        config: `config.json` as a dict, or vLLM's `hf_config`.

    Returns:
        `(task, fields)`, or `(None, None)` for a model that generates.
    """
    for task in POOLING_TASKS:
        fields = (
            config.get(task.field) if isinstance(config, dict) else getattr(config, task.field, None)
        )
        if fields is not None:
            return task, fields
    return None, None
