"""Where a model comes from: a bundled preset, a local ``config.json``, or a Hugging Face id.

Presets are data files (``cabe/data/models/<name>.json``: a Hub ``config.json`` plus a ``_cabe``
block), read lazily on first use. Hub ids are fetched with ``huggingface_hub`` (``config.json``
only, cached; never ``trust_remote_code``).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from cabe import families, hub, jsonio
from cabe.architecture import ModelSpec
from cabe.errors import ConfigError, InvalidValueError, UnknownPresetError

#: Largest config.json cabe reads (a real one is a few kB).
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: its config dict, how it was found, and the preset metadata if any."""

    name: str
    kind: str  # "preset" | "file" | "hub" | "inline"
    config: Mapping[str, Any]
    meta: Mapping[str, Any]

    @property
    def spec(self) -> ModelSpec:
        return families.from_config(self.config, name=self.name)

    @property
    def known(self) -> bool:
        """Whether a family module reads this config's ``model_type`` (the analytic path knows it).
        A config it does not know is still a model the trace can build (:mod:`cabe.via_trace`)."""
        return self.config.get("model_type") in families.supported_model_types()


def _models_dir() -> Any:
    return resources.files("cabe") / "data" / "models"


@lru_cache(maxsize=1)
def preset_names() -> tuple[str, ...]:
    """Names of the bundled model presets, sorted."""
    return tuple(sorted(p.name[:-5] for p in _models_dir().iterdir() if p.name.endswith(".json")))


@cache
def _load_preset_raw(name: str) -> dict[str, Any]:
    return json.loads((_models_dir() / f"{name}.json").read_text(encoding="utf-8"))


def preset(name: str) -> ModelSource:
    """Load a preset by short name (case-insensitive). Raises :class:`UnknownPresetError`."""
    key = name.strip().lower()
    if key not in preset_names():
        raise UnknownPresetError("unknown_model", "model", value=name, suggestions=", ".join(_suggest(key)))
    raw = dict(_load_preset_raw(key))
    meta = raw.pop("_cabe", {})
    return ModelSource(name=key, kind="preset", config=raw, meta=meta)


def _suggest(key: str, limit: int = 5) -> list[str]:
    import difflib

    names = preset_names()
    close = difflib.get_close_matches(key, names, n=limit, cutoff=0.6)
    if not close:
        family = key.split("-")[0]
        close = [n for n in names if len(family) >= 3 and n.startswith(family)][:limit]
    return close


#: Most parameters a config may describe (10^15: a thousand times the largest model published);
#: beyond it the figures stop meaning anything and real numbers would overflow.
MAX_PARAMETERS = 10**15


def from_mapping(config: Any, name: str = "config.json") -> ModelSource:
    """A config given inline (an uploaded ``config.json`` parsed as JSON)."""
    if not isinstance(config, Mapping):
        raise ConfigError("config_not_object", "model")
    if jsonio.depth(config) > jsonio.MAX_DEPTH:
        raise ConfigError("config_too_deep", "model", limit=jsonio.MAX_DEPTH)
    cfg = dict(config)
    cfg.pop("_cabe", None)
    src = ModelSource(name=name, kind="inline", config=cfg, meta={})
    _check_spec(src)  # validate now: a bad config fails here, not later
    return src


def _check_spec(src: ModelSource) -> None:
    """Build the spec once and bound its size: a number no float can hold, or a model beyond
    :data:`MAX_PARAMETERS`, is a bad config, not a crash three modules later. A ``model_type`` no family
    module reads is left to transformers (the trace builds it; :mod:`cabe.via_trace`): asking for its
    spec raises ``unsupported_architecture`` where the analytic path needs one."""
    model_type = src.config.get("model_type")
    if isinstance(model_type, str) and model_type and not src.known:
        return
    try:
        count = src.spec.parameter_count
    except (OverflowError, RecursionError, MemoryError):
        raise ConfigError("config_too_big", "model", limit=MAX_PARAMETERS) from None
    if count > MAX_PARAMETERS:
        raise ConfigError("config_too_big", "model", limit=MAX_PARAMETERS)
    spec = src.spec
    if spec.head_dim < 1:  # hidden_size smaller than the number of heads: hidden // heads == 0
        raise ConfigError("config_head_dim_zero", "model", hidden=spec.hidden_size, heads=spec.num_heads)
    if spec.num_kv_heads < 1 or spec.num_heads % spec.num_kv_heads:  # GQA: repeat_kv needs a whole ratio
        raise ConfigError("config_heads_not_divisor", "model", heads=spec.num_heads, kv_heads=spec.num_kv_heads)


def from_file(path: str | os.PathLike[str]) -> ModelSource:
    """Read a local ``config.json``. Raises :class:`ConfigError` for unreadable or malformed files."""
    p = Path(path)
    try:
        if p.is_dir():
            p = p / "config.json"
        st = p.stat()
    except OSError:
        raise ConfigError("config_not_found", "model", path=_short_path(p)) from None
    if not stat.S_ISREG(st.st_mode):  # /dev/zero, a pipe: its size says nothing and a read would not end
        raise ConfigError("config_not_regular", "model", path=_short_path(p))
    if st.st_size > MAX_CONFIG_BYTES:
        raise ConfigError("config_too_large", "model", path=_short_path(p), limit=MAX_CONFIG_BYTES)
    try:
        with p.open("rb") as fh:  # bounded: a file that grows after stat() is read no further than the limit
            raw = fh.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError("config_too_large", "model", path=_short_path(p), limit=MAX_CONFIG_BYTES)
        data = jsonio.loads(raw.decode("utf-8"), non_finite=True)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("config_malformed", "model", path=_short_path(p), detail=str(exc)[:200]) from None
    except InvalidValueError as err:  # NaN, 1e999, a 400-digit integer, nesting 64 deep
        code = {"number_too_long": "config_number_too_long", "too_deep": "config_too_deep"}.get(err.code)
        raise ConfigError(code or "config_not_finite", "model", key=err.field or "", **err.params) from None
    src = from_mapping(data, name=str(p))
    return ModelSource(name=str(p), kind="file", config=src.config, meta={})


def _short_path(p: Path | str, limit: int = 120) -> str:
    """A path as an error shows it: a 4,000-character name is cut, not echoed whole."""
    text = str(p)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def from_hub(repo_id: str, *, revision: str | None = None) -> ModelSource:
    """Fetch ``config.json`` of a Hugging Face model for the command line and Python.

    huggingface_hub's local cache is read first (when it is installed); otherwise the file is fetched
    by :mod:`cabe.hub` with the command line's bounds (a few seconds, one retry: ``hub_offline`` or
    ``hub_timeout`` in one sentence).
    """
    hub.check_repo_id(repo_id, revision)
    path = _cached_path(repo_id, revision)
    if path is not None:
        src = from_file(path)
        return ModelSource(name=repo_id, kind="hub", config=src.config, meta={"hf_id": repo_id})
    return hub_source(repo_id, hub.parse(hub.fetch_bytes(repo_id, revision, hub.CLI), repo_id))


def hub_source(repo_id: str, config: Mapping[str, Any]) -> ModelSource:
    src = from_mapping(config, name=repo_id)
    return ModelSource(name=repo_id, kind="hub", config=src.config, meta={"hf_id": repo_id})


def _cached_path(repo_id: str, revision: str | None) -> str | None:
    """huggingface_hub's cached ``config.json`` of the repo, or None (not installed, not cached)."""
    try:
        import huggingface_hub as hf
    except ImportError:
        return None
    try:
        path = hf.hf_hub_download(repo_id, "config.json", revision=revision, local_files_only=True)
    except Exception:  # LocalEntryNotFoundError and friends: not in the cache
        return None
    return path if isinstance(path, str) else None


#: How the current request reaches the Hub: None is the command line's :func:`from_hub`; the server
#: sets its own (bounded, cached, or refusing) for each request (:func:`hub_scope`).
_HUB: ContextVar[Callable[[str], ModelSource] | None] = ContextVar("cabe_hub", default=None)


def hub_model(repo_id: str) -> ModelSource:
    """A Hub id: the bundled preset when it is one (:func:`preset_for_id`, no network), else through
    the current request's Hub (:func:`hub_scope`), the command line's by default."""
    name = preset_for_id(repo_id)
    if name is not None:
        return preset(name)
    fetch = _HUB.get()
    return (fetch or from_hub)(repo_id)


@lru_cache(maxsize=1)
def _hub_ids() -> dict[str, str]:
    """Each preset's Hub id (lower case) -> the preset's name."""
    out: dict[str, str] = {}
    for n in preset_names():
        hid = _load_preset_raw(n).get("_cabe", {}).get("hf_id")
        if hid:
            out[str(hid).lower()] = n
    return out


#: Suffixes of a sibling repo with the same architecture (the instruction-tuned or converted weights).
_SIBLING_SUFFIXES = ("-instruct", "-it", "-chat", "-chat-hf", "-hf")


def preset_for_id(text: str) -> str | None:
    """The bundled preset a name or Hub id stands for, or None: the one resolver every interface uses.

    A preset's own name; its Hub id (``meta-llama/Llama-3.1-8B``, any case); the id of a sibling with
    the same ``config.json`` architecture (``-Instruct``, ``-it``, ``-chat``; ``google/gemma-3-1b-it``
    for the ``-pt`` preset). Nothing here touches the network.
    """
    if not isinstance(text, str):
        return None
    key = text.strip().lower().rstrip("/")
    if key in preset_names():
        return key
    by_id = _hub_ids()
    if key in by_id:
        return by_id[key]
    for suffix in _SIBLING_SUFFIXES:
        if key.endswith(suffix) and key[: -len(suffix)] in by_id:
            return by_id[key[: -len(suffix)]]
        if key + "-hf" in by_id and key.endswith(suffix):
            break
    base = key.removesuffix("-pt").removesuffix("-it")
    for hid, name in by_id.items():  # google/gemma-3-1b-it <-> google/gemma-3-1b-pt
        if hid.endswith("-pt") and hid[:-3] == base:
            return name
    return None


def preset_for_repo(repo: str) -> str | None:
    """The bundled preset whose Hub repo name (without its organisation) is ``repo``, or its sibling's (as
    :func:`preset_for_id`): for mirrors that keep the name under another organisation (unsloth's
    ``unsloth/Llama-3.2-1B-Instruct``). None when no preset has that name."""
    key = str(repo).strip().lower()
    for hid in _hub_ids():
        org, _, name = hid.partition("/")
        for candidate in (key, *(key.removesuffix(s) for s in _SIBLING_SUFFIXES if key.endswith(s))):
            if name == candidate:
                return preset_for_id(f"{org}/{key}")
    return None


@contextmanager
def hub_scope(fetch: Callable[[str], ModelSource]) -> Iterator[None]:
    token = _HUB.set(fetch)
    try:
        yield
    finally:
        _HUB.reset(token)


def _is_path(text: str) -> bool:
    """An existing file, or a folder given with a separator. A name the OS refuses (too long, a NUL
    byte) is not a path."""
    try:
        return (os.sep in text and Path(text).exists()) or Path(text).is_file()
    except (OSError, ValueError):
        return False


def resolve(model: str) -> ModelSource:
    """Resolve what the user typed: a preset name, a path to a config.json, or a Hub id."""
    if not isinstance(model, str) or not model.strip():
        raise ConfigError("empty_model", "model")
    text = model.strip()
    if text.lower() in preset_names():
        return preset(text)
    if text.endswith(".json") or _is_path(text):
        return from_file(text)
    if "/" in text and not text.startswith((".", "/")):
        return hub_model(text)
    return preset(text)  # raises UnknownPresetError with suggestions
