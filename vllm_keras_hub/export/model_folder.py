"""A temporary model folder of a preset, shared by the engines that use it.

`ModelFolder` writes a preset's model folder (`preset_folder.py`) under a
path derived from its contents, and removes it when its last user lets go.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import uuid
import weakref

from vllm_keras_hub import families
from vllm_keras_hub import tasks
from vllm_keras_hub.export import architectures
from vllm_keras_hub.export.preset_folder import write_model_folder
from vllm_keras_hub.tasks import audio_to_text


def _content_digest(directory):
    digest = hashlib.sha256()
    for root, folders, names in sorted(os.walk(directory)):
        folders.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, directory).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()[:20]


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


@contextlib.contextmanager
def _locked():
    # One lock file for all model folders: it is never removed, so no user
    # can lock a file another has just deleted.
    with open(os.path.join(tempfile.gettempdir(), "vllm_keras_hub.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _release(path, marker):
    """Drops one user of a shared folder; the last live user removes it."""
    with _locked():
        with contextlib.suppress(FileNotFoundError):
            os.remove(marker)
        users = path + ".users"
        live = [
            name
            for name in (os.listdir(users) if os.path.isdir(users) else [])
            if _pid_alive(int(name.split("-")[0]))
        ]
        if not live:
            shutil.rmtree(path, ignore_errors=True)
            shutil.rmtree(users, ignore_errors=True)


class FolderConfig:
    """What a written model folder's `config.json` tells the engine settings
    (`settings.settle`) and the model classes.

    Args:
        directory: The model folder.
        tokenizer_mode: What `write_model_folder` returned for it.
    """

    def __init__(self, directory, tokenizer_mode):
        self.tokenizer_mode = tokenizer_mode
        with open(os.path.join(directory, "config.json")) as f:
            config = json.load(f)
        self.family = families.family_by_name(config["keras_hub_family"])
        # The vLLM model class's name.
        self.architecture = architectures.current(config["architectures"][0])
        # The preset, as the model class loads it (local folders absolute).
        self.preset = config["keras_hub_preset"]
        # The image format of a preset served with images (`export/image_format.py`),
        # else `None`.
        self.images = config.get("keras_hub_image")
        # Its audio format (`export/audio_format.py`), else `None`.
        self.audio = config.get("keras_hub_audio")
        # Its video format (`export/video_format.py`), else `None`.
        self.video = config.get("keras_hub_video")
        # A speech-to-text task's fields (`tasks/audio_to_text/`), else `None`.
        self.audio_to_text = config.get(audio_to_text.FIELD)
        # A pooling task's fields (`tasks/`), else `None`.
        self.pooling_task, self.pooling = tasks.of_config(config)
        # vLLM's parsers for the chat format's tool calls and thinking
        # (`export/chat_templates.py`), else `None`.
        self.tool_parser = config.get("keras_hub_tool_parser")
        self.reasoning_parser = config.get("keras_hub_reasoning_parser")
        # A drafter preset's Hugging Face model type (`export/drafter.py`),
        # else `None`: it only proposes tokens for a target.
        self.drafter = config.get("keras_hub_drafter")
        # The longest context it is exported for.
        self.max_model_len = config.get("max_position_embeddings")


class ModelFolder(FolderConfig):
    """A temporary model folder, removed on `cleanup()`, GC or exit.

    The folder's path is derived from its contents, so the same preset with
    the same settings gets the same path each time. vLLM keys its
    torch.compile caches by the model path: a stable path lets a restarted
    engine reuse its compiled kernels, where a fresh path each time would
    compile from scratch and leave a new cache folder behind on every start.
    Engines that share a folder at once (in this or other processes) each
    hold it; the last one to let go removes it.

    Args:
        preset: Anything `keras_hub.models.CausalLM.from_preset` accepts.
        max_model_len: See `write_model_folder`.
    """

    def __init__(self, preset, max_model_len=None):
        staging = tempfile.mkdtemp(prefix="vllm_keras_hub_staging_")
        try:
            self.tokenizer_mode = write_model_folder(
                preset, staging, max_model_len=max_model_len
            )
            self.path = os.path.join(
                tempfile.gettempdir(), f"vllm_keras_hub_{_content_digest(staging)}"
            )
            marker = os.path.join(
                self.path + ".users", f"{os.getpid()}-{uuid.uuid4().hex}"
            )
            with _locked():
                if os.path.isdir(self.path):
                    shutil.rmtree(staging)
                else:
                    os.rename(staging, self.path)
                os.makedirs(self.path + ".users", exist_ok=True)
                open(marker, "w").close()
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self._finalizer = weakref.finalize(self, _release, self.path, marker)
        super().__init__(self.path, self.tokenizer_mode)

    def cleanup(self):
        """Lets go of the folder now. Safe to call more than once."""
        self._finalizer()
