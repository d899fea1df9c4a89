"""A preset's weights, read one variable at a time, only where a rank needs them.

vLLM's own loaders stream a checkpoint tensor by tensor: a rank reads a
tensor, its layer's `weight_loader` keeps the rank's slice, and the tensor
is dropped, so no rank holds the whole model. KerasHub's `from_preset`
loads every weight of the backbone at once. Here the backbone is built with
no weight allocated (`unloaded_backbone`), and Keras's own weight walk
(`saving_lib._load_state`, what `load_weights` runs) is run once to learn
where each variable is stored, without reading any data. `PresetWeights`
then reads each variable only when asked:
- `read(variable)` gives its stored value without keeping it, for a vLLM
  layer's weight loader to take its slice (tensor-parallel shards, fused
  experts);
- `release(variables)` drops what this rank never uses (another pipeline
  stage's layers) unread;
- `finish()` keeps what is left, the weights KerasHub's own layers compute
  with (norms, biases, embeddings, unsharded matmuls).
"""

import contextlib
import functools

import torch


class _Stored:
    """Where one variable's value is: the store entry's path and key."""

    def __init__(self, path, key):
        self.path = path
        self.key = key


def _recording_class(store_class):
    # An entry lookup answers with the variable's location, not its data.
    def locate(self, key):
        if key not in self:  # as Keras's own lookup fails
            raise KeyError(key)
        return _Stored(self._h5_entry_path, key)

    return type(store_class.__name__, (store_class,), {"__getitem__": locate})


def _weights_file(loader):
    from keras_hub.src.utils.preset_utils import MODEL_WEIGHTS_FILE
    from keras_hub.src.utils.preset_utils import SHARDED_MODEL_WEIGHTS_CONFIG_FILE
    from keras_hub.src.utils.preset_utils import check_file_exists
    from keras_hub.src.utils.preset_utils import get_file

    # As `KerasPresetLoader._load_backbone_weights` finds it.
    if check_file_exists(loader.preset, MODEL_WEIGHTS_FILE):
        return get_file(loader.preset, MODEL_WEIGHTS_FILE)
    index = get_file(loader.preset, SHARDED_MODEL_WEIGHTS_CONFIG_FILE)
    for filename in loader._get_sharded_filenames(index):
        get_file(loader.preset, filename)
    return index


def _open_store(path):
    from keras.src.saving.saving_lib import H5IOStore
    from keras.src.saving.saving_lib import ShardedH5IOStore

    if str(path).endswith(".weights.json"):
        return ShardedH5IOStore(path, mode="r")
    return H5IOStore(path, mode="r")


def unloaded_backbone(preset, dtype):
    """The preset's backbone with no weight allocated.

    Built in a `keras.StatelessScope` that leaves variables uninitialized,
    Keras's own way to build a model without allocating it: each variable
    keeps its initializer and shape until `PresetWeights` gives it a value.
    """
    import copy

    import keras
    from keras.src.backend.common import global_state

    from vllm_keras_hub.preset import Preset

    preset = Preset.of(preset)
    # keras-hub writes the dtype into a saved `DTypePolicyMap` of the
    # config it loads from: a copy, so the preset's config stays as read.
    loader = copy.copy(preset.loader)
    loader.config = copy.deepcopy(preset.config)
    before = list(global_state.get_global_attribute("uninitialized_variables") or [])
    try:
        with keras.StatelessScope(initialize_variables=False):
            # `Backbone.from_preset`, on the loader already read.
            backbone = loader.load_backbone(
                preset.backbone_cls, load_weights=False, dtype=dtype
            )
    except BaseException:
        # Or the next `StatelessScope` to exit would initialize them all.
        global_state.set_global_attribute("uninitialized_variables", before)
        raise
    _forget_uninitialized(backbone.variables)
    return backbone


class PresetWeights:
    """The stored weights of an unloaded backbone, read on demand.

    A KerasHub preset (`model.weights.h5`, or sharded) is read variable by
    variable, each only when asked for. A Hugging Face checkpoint goes
    through keras-hub's converter, which reads it whole: its values are
    converted once, at the first read, keeping only what is not released.

    Args:
        backbone: A backbone from `unloaded_backbone`.
        preset: The preset it was built from.
    """

    def __init__(self, backbone, preset):
        from keras_hub.src.utils.preset_utils import KerasPresetLoader

        from vllm_keras_hub.preset import Preset

        self.backbone = backbone
        self._pending = {}
        self._store = None
        self._released = set()
        self._loader = Preset.of(preset).loader
        self._variables = {id(v): v for v in backbone.variables}
        self._initializers = {}
        if isinstance(self._loader, KerasPresetLoader):
            self._locate_stored()
        else:
            self._pending = {key: (v, None) for key, v in self._variables.items()}
        # Until read, a variable's value would be its random initializer's.
        for variable, _ in self._pending.values():
            self._initializers[id(variable)] = variable._initializer
            variable._initializer = functools.partial(_not_loaded, variable.path)

    def _locate_stored(self):
        from keras.src.saving import saving_lib

        self._store = _open_store(_weights_file(self._loader))
        store_class = type(self._store)
        self._store.__class__ = _recording_class(store_class)
        with _assigns_to(self._variables.values(), self._record):
            try:
                saving_lib._load_state(
                    self.backbone,
                    weights_store=self._store,
                    assets_store=None,
                    inner_path="",
                    visited_saveables=set(),
                )
            finally:
                self._store.__class__ = store_class
        # What Keras's load leaves alone (seed generators' states) keeps
        # its initial value, as after `from_preset`.
        for key, variable in self._variables.items():
            if key not in self._pending:
                self._set(variable, variable.value)

    def _converter_pending(self):
        from keras_hub.src.utils.preset_utils import KerasPresetLoader

        return not isinstance(self._loader, KerasPresetLoader) and not getattr(
            self, "_converted", False
        )

    def _convert(self):
        # keras-hub's converter assigns every variable it reads; the ones
        # released are dropped as they come, the rest kept until asked for.
        from keras_hub.src.utils.transformers.safetensor_utils import SafetensorLoader

        def record(variable, value):
            if self.pending(variable):
                self._record(variable, value)

        self._converted = True
        variables = self._variables.values()
        with _assigns_to(variables, record), SafetensorLoader(self._loader.preset) as f:
            self._loader.converter.convert_weights(self.backbone, f, self._loader.config)
        for key, (variable, value) in list(self._pending.items()):
            if value is None:  # not in the checkpoint: as after `from_preset`
                variable._initializer = self._initializers[key]
                self._set(variable, variable.value)

    def _record(self, variable, value):
        if not isinstance(value, _Stored):
            # Computed while loading (a LoRA kernel's zeros, a converted
            # checkpoint tensor, often a transposed view): keep it.
            value = variable._convert_to_tensor(value, dtype=variable._dtype)
            value = _checked(variable, value).contiguous()
        self._pending[id(variable)] = (variable, value)

    def released(self, variable):
        """Whether `variable` was dropped: this rank holds no value for it."""
        return id(variable) in self._released

    def pending(self, variable):
        """Whether `variable` has not been read, kept or released yet."""
        return id(variable) in self._pending

    def read(self, variable):
        """`variable`'s stored value, in its dtype, without keeping it.

        A variable already kept returns its value.

        Raises:
            ValueError: the stored value's shape is not the variable's, as
                Keras's `assign` would raise, or the variable was released.
        """
        if self.released(variable):
            raise ValueError(f"{variable.path} was released: this rank holds none of it.")
        if not self.pending(variable):
            return variable.value
        if self._converter_pending():
            self._convert()
            return self.read(variable)
        _, stored = self._pending[id(variable)]
        if isinstance(stored, _Stored):
            stored = self._store.get(stored.path)[stored.key]
        return _checked(variable, variable._convert_to_tensor(stored, dtype=variable._dtype))

    def read_slice(self, variable, start, stop, axis=0):
        """`variable`'s stored value from `start` to `stop` along `axis`.

        From a KerasHub preset in one file, only that slice is read from
        the file (a vocabulary-parallel rank's rows of a 262,144-row table,
        not the whole table); otherwise it is cut from `read(variable)`.

        Args:
            variable: A pending or kept variable.
            start: The slice's first index along `axis`.
            stop: One past its last.
            axis: 0 (rows) or 1 (columns).
        """
        dataset = self._dataset(variable)
        if dataset is None:
            whole = self.read(variable)
            return whole[start:stop] if axis == 0 else whole[:, start:stop]
        if tuple(dataset.shape) != tuple(variable.shape):
            _checked(variable, dataset)  # raises, naming both shapes
        value = dataset[(slice(None),) * axis + (slice(start, stop),)]
        if dataset.attrs.get("dtype") == "bfloat16":
            # Keras stores bfloat16 as 2-byte opaque values (its reader
            # converts the whole dataset); a slice is viewed as bfloat16.
            import ml_dtypes

            value = value.view(ml_dtypes.bfloat16)
        return variable._convert_to_tensor(value, dtype=variable._dtype)

    def _dataset(self, variable):
        # The h5py dataset a pending variable is stored in, where the
        # preset is one `.weights.h5` file (a sharded one, or a converted
        # checkpoint: `None`).
        from keras.src.saving.saving_lib import H5IOStore
        from keras.src.saving.saving_lib import safe_get_h5_dataset

        if not self.pending(variable) or type(self._store) is not H5IOStore:
            return None
        _, stored = self._pending[id(variable)]
        if not isinstance(stored, _Stored):
            return None
        group = self._store.get(stored.path)._h5_entry_group
        return safe_get_h5_dataset(group, stored.key)

    def materialize(self, variables):
        """Reads and keeps the pending ones of `variables` in Keras's layers."""
        for variable in variables:
            if self.pending(variable):
                self._set(variable, self.read(variable))

    def keep(self, variable, value):
        """Keeps `value` (a slice of the stored one) as `variable`'s value."""
        self._set(variable, value)

    def release(self, variables):
        """Drops `variables`, read or not: this rank holds none of them."""
        for variable in variables:
            self._released.add(id(variable))
            if self.pending(variable) or variable._value is None:
                self._set(variable, _empty(variable))
            else:
                variable.value.data = _empty(variable)

    def _set(self, variable, value):
        self._pending.pop(id(variable), None)
        variable._initialize(value)
        variable._initializer = None

    def finish(self):
        """Keeps every variable still pending and closes the preset's file.

        Call once the variables this rank does not use are released and
        the ones vLLM's layers hold are read: what is left is what Keras's
        own layers compute with.
        """
        self.materialize([variable for variable, _ in list(self._pending.values())])
        self.close()
        # What `Layer._post_build` registers after a plain build (skipped
        # in the stateless one): each layer's variables as torch parameters.
        for layer in self.backbone._flatten_layers(include_self=False):
            if layer.built:
                layer._track_variables()

    def close(self):
        """Closes the preset's file; call it if loading stops half way."""
        if self._store is not None:
            self._store.close()
            self._store = None


@contextlib.contextmanager
def _assigns_to(variables, record):
    # Keras's weight walk and keras-hub's converters give each variable its
    # value with `variable.assign(value)`.
    for variable in variables:
        variable.assign = functools.partial(record, variable)
    try:
        yield
    finally:
        for variable in variables:
            del variable.assign


def _checked(variable, value):
    if tuple(value.shape) != tuple(variable.shape):
        raise ValueError(
            f"The preset stores {variable.path} with shape {tuple(value.shape)}, "
            f"but the backbone's variable has shape {tuple(variable.shape)}."
        )
    return value


def _not_loaded(path, *args, **kwargs):
    raise RuntimeError(f"{path} was read before the preset's value was loaded.")


class LoadedWeights:
    """`PresetWeights`' reads over a model already loaded whole.

    For a small model every rank loads whole (a drafter), so the sharding
    code that reads, keeps and releases through `PresetWeights` cuts its
    matmuls the same way.
    """

    def read(self, variable):
        return variable.value

    def keep(self, variable, value):
        variable.value.data = value

    def release(self, variables):
        for variable in variables:
            variable.value.data = _empty(variable)


def _empty(variable):
    from keras.src.backend.torch.core import to_torch_dtype

    return torch.empty(0, dtype=to_torch_dtype(variable._dtype))


def _forget_uninitialized(variables):
    # Keras initializes every variable a `StatelessScope` left uninitialized
    # when the next one exits (Keras's torch backend opens one to infer
    # shapes); these get their values from the preset instead.
    from keras.src.backend.common import global_state

    ours = {id(variable) for variable in variables}
    waiting = global_state.get_global_attribute("uninitialized_variables") or []
    global_state.set_global_attribute(
        "uninitialized_variables", [v for v in waiting if id(v) not in ours]
    )
