"""A KerasHub preset whose files are each read at most once.

Writing a model folder asks a preset many things: its backbone class and
config, its task, its preprocessor, its tokenizer, its image, audio and video
converters, its chat template. Each of keras-hub's `from_preset` and
`load_json` opens the files again (`get_preset_loader` reads `config.json`
each time), so the writers share one `Preset` instead: it opens each file
once, with keras-hub's own loader, and keeps what it read.

A `Preset` lives as long as the export that made it: a folder saved over
between two exports is read afresh.
"""

import functools
import os

# First: keras-hub imports Keras, on torch.
from vllm_keras_hub import keras_on_torch  # noqa: F401
from keras_hub.src.utils import preset_utils
from keras_hub.src.utils.preset_utils import find_subclass

from vllm_keras_hub import families


class PresetError(ValueError):
    """A preset that cannot be opened, naming the preset and the cause."""


class Preset(str):
    """A preset reference, and what was read from it.

    A `str`, the reference itself, so it goes wherever keras-hub or a
    config takes one; it pickles as the bare reference, read afresh.

    Args:
        reference: Anything `keras_hub.models.CausalLM.from_preset` accepts:
            a local folder (resolved by the caller), `kaggle://`, `hf://`.
    """

    def __init__(self, reference):
        super().__init__()
        self._json = {}
        self._exists = {}
        self._loaded = {}
        self._kept = {}

    def __reduce__(self):
        return (Preset, (self.reference,))

    @classmethod
    def of(cls, preset):
        """`preset` if it is a `Preset` already, else a new one for it."""
        return preset if isinstance(preset, Preset) else cls(preset)

    @property
    def reference(self):
        """The reference, as a plain `str`."""
        return str.__str__(self)

    @functools.cached_property
    def loader(self):
        """keras-hub's loader of the preset (`get_preset_loader`).

        Raises:
            PresetError: the preset is missing or unreadable, naming why.
        """
        try:
            loader = preset_utils.get_preset_loader(self.reference)
            loader.check_backbone_class()
        except Exception as e:  # noqa: BLE001 - re-raised with the preset named
            raise PresetError(
                f"Cannot open KerasHub preset '{self.reference}': {type(e).__name__}: {e}"
            ) from e
        # Its config.json is read: whether it exists is known.
        self._exists[preset_utils.CONFIG_FILE] = True
        self._json[preset_utils.CONFIG_FILE] = loader.config
        return loader

    @property
    def config(self):
        """The preset's `config.json`."""
        return self.loader.config

    @functools.cached_property
    def backbone_cls(self):
        return self.loader.check_backbone_class()

    @functools.cached_property
    def family(self):
        """The preset's `families.Family`, by its backbone class."""
        return families.family_for_backbone(self.backbone_cls.__name__, self.reference)

    def part(self, name):
        """Its family's part `name` (`families.part`), or `None`."""
        return families.part(self.family, name)

    @property
    def converter(self):
        """keras-hub's converter of a Hugging Face checkpoint, else `None`."""
        return getattr(self.loader, "converter", None)

    def has(self, name):
        """Whether the preset has the file `name`."""
        if name not in self._exists:
            self._exists[name] = preset_utils.check_file_exists(self.reference, name)
        return self._exists[name]

    def path(self, name):
        """The local path of the preset's file `name` (downloaded if remote)."""
        return preset_utils.get_file(self.reference, name)

    def json(self, name):
        """The preset's JSON file `name`, or `None` where it has none."""
        if name not in self._json:
            self._json[name] = (
                preset_utils.load_json(self.reference, name) if self.has(name) else None
            )
        return self._json[name]

    @property
    def task_config(self):
        """Its `task.json`, or `None`."""
        return self.json(preset_utils.TASK_CONFIG_FILE)

    @property
    def preprocessor_config(self):
        """Its `preprocessor.json`'s `config`, or `{}`."""
        return (self.json(preset_utils.PREPROCESSOR_CONFIG_FILE) or {}).get("config", {})

    def load(self, base_cls, exact=False):
        """The preset's tokenizer or converter of `base_cls`, built once.

        As `base_cls.from_preset` builds it (the subclass for the preset's
        backbone, then keras-hub's loader), without opening `config.json`
        again.

        Args:
            base_cls: `Tokenizer`, `ImageConverter`, `AudioConverter` or
                `VideoConverter`, or one of their subclasses.
            exact: Build `base_cls` itself, with no subclass looked up.
        """
        key = (base_cls, exact)
        if key not in self._loaded:
            cls = base_cls
            if not exact and cls.backbone_cls != self.backbone_cls:
                cls = find_subclass(self.reference, cls, self.backbone_cls)
            self._loaded[key] = self._load(cls)
        return self._loaded[key]

    def kept(self, make):
        """`make(self)`, made once for this `Preset` (a converter built from
        its preprocessor's config, say): a folder saved over is a new
        `Preset` in a serving process (`served`), read afresh."""
        if make not in self._kept:
            self._kept[make] = make(self)
        return self._kept[make]

    def _load(self, cls):
        from keras_hub.src.layers.preprocessing.audio_converter import AudioConverter
        from keras_hub.src.layers.preprocessing.image_converter import ImageConverter
        from keras_hub.src.layers.preprocessing.video_converter import VideoConverter

        if issubclass(cls, ImageConverter):
            return self.loader.load_image_converter(cls)
        if issubclass(cls, AudioConverter):
            return self.loader.load_audio_converter(cls)
        if issubclass(cls, VideoConverter):
            return self.loader.load_video_converter(cls)
        return self.loader.load_tokenizer(cls)


def served(reference):
    """The `Preset` this serving process reads `reference` from.

    One per reference and process (the last four kept), shared by the model
    and the media processors. A local folder saved over since (its
    `config.json` rewritten) is read afresh, as an export reads it: an
    in-process engine started again on it must not load the old config.
    """
    reference = str.__str__(reference)
    config = os.path.join(reference, preset_utils.CONFIG_FILE)
    stamp = os.stat(config).st_mtime_ns if os.path.isfile(config) else None
    return _served(reference, stamp)


@functools.lru_cache(maxsize=4)
def _served(reference, stamp):
    return Preset(reference)
