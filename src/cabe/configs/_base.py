"""Shared pieces of the config readers: file reading, the field collector, name tables.

Every reader module (``training_args``, ``peft_config``, ``bnb``, ``deepspeed``, ``accelerate``,
``axolotl``, ``torchtune``) exposes ``read(path_or_dict) -> Mapping`` and
``to_request(data) -> (request_fields, used, ignored)``; ``ignored`` is a list of
``(field, reason_code)`` whose sentences live in ``i18n/*/integrations.json`` as
``from_config.reason.<code>``.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cabe import jsonio, models, optimizer
from cabe.errors import ConfigError, InvalidValueError, MissingDependencyError

#: Largest config file cabe reads (a real one is a few kB).
MAX_BYTES = 1 << 20

#: Reason codes for ignored fields (each has ``from_config.reason.<code>`` in the catalogs).
REASONS = ("no_effect", "auto", "null", "not_modeled", "unsupported_value", "other_file", "overridden", "unknown")


#: Most items a YAML file may expand to once its aliases are followed (a training config has a few
#: hundred; nine aliases nested eight deep, the "billion laughs", expand to 9**8 = 43 million).
MAX_ITEMS = 100_000


def _expanded_items(root: Any, path: str) -> int:
    """How many nodes the YAML node graph ``root`` holds with every alias expanded, refusing past
    :data:`MAX_ITEMS` or a cycle (an anchor used inside itself expands without end).

    PyYAML's composer returns the anchored node itself for an alias (``yaml/composer.py``,
    ``compose_node``: ``return self.anchors[anchor]``, PyYAML 6.0), so the graph is small however large
    its expansion; the sizes are memoised per node, and the walk is iterative (no recursion limit).
    """
    import yaml

    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children: list[Any] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            if size[key] > MAX_ITEMS:
                raise ConfigError("cfg_too_many_items", "file", path=path, limit=MAX_ITEMS)
            continue
        if key in size:
            continue
        if key in on_path:  # an anchor inside itself: an endless expansion
            raise ConfigError("cfg_too_many_items", "file", path=path, limit=MAX_ITEMS)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)
    return size[id(root)]


def _bounded_loader(path: str) -> Any:
    """A safe YAML loader (libyaml's when there) that counts the expanded document before building it."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Bounded(base):  # type: ignore[valid-type,misc]
        def construct_document(self, node: Any) -> Any:
            _expanded_items(node, path)
            return super().construct_document(node)

    return Bounded


def load_yaml(text: str, path: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise MissingDependencyError("missing_extra", "file", extra="yaml", package="pyyaml") from None
    try:
        data = yaml.load(text, Loader=_bounded_loader(path))  # a SafeLoader subclass: safe
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())[:200]
        if (
            "maximum nesting depth" in detail
        ):  # libyaml stops at 1,000 levels (libyaml 0.2.5 src/scanner.c, yaml_parser_increase_flow_level)
            raise ConfigError("cfg_too_deep", "file", path=path, limit=jsonio.MAX_DEPTH) from None
        raise ConfigError("cfg_malformed", "file", path=path, kind="YAML", detail=detail) from None
    except RecursionError:
        raise ConfigError("cfg_too_deep", "file", path=path, limit=jsonio.MAX_DEPTH) from None
    if jsonio.depth(data) > jsonio.MAX_DEPTH:
        raise ConfigError("cfg_too_deep", "file", path=path, limit=jsonio.MAX_DEPTH)
    return data


def parse_text(text: str, path: str) -> Any:
    """JSON when it looks like JSON (or the name ends in .json), else YAML (safe_load only)."""
    name = path.lower()
    stripped = text.lstrip()
    if name.endswith(".json") or stripped.startswith(("{", "[")):
        try:
            return jsonio.loads(text)
        except InvalidValueError as err:  # NaN, 1e999, a 400-digit integer, nesting 64 deep
            code = {"number_too_long": "cfg_number_too_long", "too_deep": "cfg_too_deep"}.get(err.code)
            raise ConfigError(code or "cfg_not_finite", "file", path=path, key=err.field or "", **err.params) from None
        except json.JSONDecodeError as exc:
            if name.endswith(".json"):
                raise ConfigError("cfg_malformed", "file", path=path, kind="JSON", detail=str(exc)) from None
            # "{a: 1}" is valid YAML flow style; let YAML have a go
    return load_yaml(text, path)


#: the key a pip requirements file's lines are read under (cabe.configs.requirements)
KEY = "_requirements"
#: ``name[extras] specifiers ; marker``, as pip reads a requirements line (PEP 508)
_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;#]*)")
SPEC = re.compile(r"(===|==|~=|>=|<=|!=|>|<)\s*([A-Za-z0-9.*+!_-]+)")


def requirements_lines(text: str) -> dict[str, Any] | None:
    """A pip requirements file or ``pip freeze`` output as ``{KEY: {name: specifier}}`` (names as PEP 503
    normalises them), or None when some line that is not blank, a comment or a pip option (``-r``, ``--index-url``)
    is not a requirement with a version specifier, or no line is one."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        m = _LINE.match(line)
        spec = m.group(3).replace(" ", "") if m else ""
        if m is None or not SPEC.match(spec.split(",")[0]):
            return None
        out[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = spec
    return {KEY: out} if out else None


def _short_path(text: str, limit: int = 120) -> str:
    """A path as an error shows it: a 4,000-character name is cut, not echoed whole."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class ConfigText:
    """A config given as its text and its file's name (the page's and ``POST /api/from-config``'s files):
    read as a file is, with the same limit (:data:`MAX_BYTES`) and parsers, never from the disk."""

    name: str
    text: str


def read(path_or_dict: Any) -> Mapping[str, Any]:
    """A config as a mapping: a dict is taken as is, a path is read as JSON or YAML, a
    :class:`ConfigText` as its file would be."""
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict)
    if isinstance(path_or_dict, ConfigText):
        path = _short_path(path_or_dict.name)
        if len(path_or_dict.text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
            raise ConfigError("cfg_too_large", "file", path=path, limit=MAX_BYTES)
        return parse_config(path_or_dict.text, path)
    if not isinstance(path_or_dict, (str, os.PathLike)):
        raise ConfigError("cfg_not_mapping", "file", path=str(path_or_dict))
    path = _short_path(str(path_or_dict))
    p = Path(path_or_dict)
    try:
        st = p.stat()
    except (OSError, ValueError):  # no such file, a name too long, a NUL byte
        raise ConfigError("cfg_not_found", "file", path=path) from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError("cfg_not_found", "file", path=path)
    if not stat.S_ISREG(st.st_mode):  # /dev/zero, a pipe: its size says nothing and a read would not end
        raise ConfigError("cfg_not_regular", "file", path=path)
    if st.st_size > MAX_BYTES:
        raise ConfigError("cfg_too_large", "file", path=path, limit=MAX_BYTES)
    try:
        with p.open("rb") as fh:  # bounded: a file that grows after stat() is read no further than the limit
            raw = fh.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise ConfigError("cfg_too_large", "file", path=path, limit=MAX_BYTES)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("cfg_malformed", "file", path=path, kind="text", detail=str(exc)[:200]) from None
    return parse_config(text, path)


def parse_config(text: str, path: str) -> Mapping[str, Any]:
    """A config file's text as a mapping: pip requirements (a ``.txt`` / ``.in`` or unsuffixed name), else JSON
    or YAML (:func:`parse_text`); anything but a mapping is ``cfg_not_mapping``."""
    if Path(path).suffix.lower() in ("", ".txt", ".in") and (reqs := requirements_lines(text)) is not None:
        return reqs  # pip requirements / freeze (cabe.configs.requirements)
    data = parse_text(text, path)
    if not isinstance(data, Mapping):
        raise ConfigError("cfg_not_mapping", "file", path=path)
    return data


class Collector:
    """Gathers the request fields a reader maps, and what it used and ignored (in file order)."""

    def __init__(self, prefix: str = "") -> None:
        self.fields: dict[str, Any] = {}
        self.used: list[str] = []
        self.ignored: list[tuple[str, str]] = []
        self.origin: dict[str, str] = {}  # request field -> the source field that set it
        self.prefix = prefix

    def name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def set(self, field: str, value: Any, source: str) -> None:
        """Map ``source`` to request ``field``; two different values from one file contradict."""
        if field == "method" and {self.fields.get(field), value} == {"lora", "qlora"}:
            value = "qlora"  # a LoRA adapter on a 4-bit base is QLoRA
        elif field in self.fields and self.fields[field] != value:
            raise ConfigError(
                "cfg_contradiction",
                field,
                first=_show(self.fields[field]),
                second=_show(value),
                source=self.name(source),
            )
        self.fields[field] = value
        self.origin.setdefault(field, self.name(source))
        self.use(source)

    def use(self, source: str) -> None:
        n = self.name(source)
        if n not in self.used:
            self.used.append(n)

    def ignore(self, source: str, reason: str) -> None:
        assert reason in REASONS, reason
        n = self.name(source)
        if n not in self.used and all(n != f for f, _ in self.ignored):
            self.ignored.append((n, reason))

    def set_known(self, field: str, value: Any, source: str) -> None:
        """Set ``field`` from a name-table look-up; ``None`` (a name the table lacks) is ignored."""
        if value is None:
            self.ignore(source, "unsupported_value")
        else:
            self.set(field, value, source)

    def convert(self, table: Mapping[str, Field], key: str, value: Any, name: str | None = None) -> bool:
        """``table`` maps ``key`` to ``(request field, converter)``: set the field and say True."""
        entry = table.get(key)
        if entry is None:
            return False
        source = key if name is None else name
        self.set(entry[0], entry[1](value, source), source)
        return True

    def flag(self, table: Mapping[str, Flag], key: str, value: Any, name: str | None = None) -> bool:
        """``table`` maps an on/off ``key`` to ``(request field, value when on)``; off is only used."""
        entry = table.get(key)
        if entry is None:
            return False
        source = key if name is None else name
        if as_bool(value, source):
            self.set(entry[0], entry[1], source)
        else:
            self.use(source)
        return True

    def result(self) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
        return dict(self.fields), list(self.used), list(self.ignored)


#: A converter: ``(value, source field) -> request value`` (raising ``cfg_bad_value``).
Convert = Callable[[Any, str], Any]
#: A :meth:`Collector.convert` table entry: ``(request field, converter)``.
Field = tuple[str, Convert]
#: A :meth:`Collector.flag` table entry: ``(request field, value when on)``.
Flag = tuple[str, Any]


def _show(v: Any, limit: int = 80) -> str:
    text = ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_auto(v: Any) -> bool:
    return isinstance(v, str) and v.strip().lower() == "auto"


def as_bool(v: Any, field: str) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "yes", "1"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("false", "no", "0", ""):
        return False
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise ConfigError("cfg_bad_value", field, value=_show(v), expected="true | false")


def as_int(v: Any, field: str) -> int:
    if isinstance(v, bool):
        raise ConfigError("cfg_bad_value", field, value=_show(v), expected="an integer")
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            pass
    raise ConfigError("cfg_bad_value", field, value=_show(v), expected="an integer")


def as_number(v: Any, field: str) -> float:
    if isinstance(v, bool):
        raise ConfigError("cfg_bad_value", field, value=_show(v), expected="a number")
    x: float | None = None
    try:
        if isinstance(v, (int, float)):
            x = float(v)
        elif isinstance(v, str):
            x = float(v.strip())
    except (ValueError, OverflowError):  # "abc", or an integer no float can hold
        x = None
    if x is None or not math.isfinite(x):
        raise ConfigError("cfg_bad_value", field, value=_show(v), expected="a finite number")
    return x


def as_str(v: Any, field: str) -> str:
    return str(v)


def as_model(v: Any, field: str) -> str:
    return model_name(v)


def as_targets(v: Any, field: str) -> tuple[str, ...]:
    """LoRA target modules: one name or a list of names."""
    return tuple(str(t) for t in ([v] if isinstance(v, str) else v))


def set_hf_optimizer(c: Collector, key: str, value: Any) -> None:
    """A transformers ``optim`` name -> ``optimizer`` (and ``optimizer_impl`` when it names one)."""
    opt = optimizer_from_hf(value)
    if opt is None:
        c.ignore(key, "unsupported_value")
    else:
        c.set("optimizer", opt[0], key)
        if opt[1]:
            c.set("optimizer_impl", opt[1], key)


# ---- name tables ---------------------------------------------------------------------------

#: transformers ``optim`` names (``OptimizerNames``) -> (cabe optimizer, optimizer_impl or None): the registry's.
HF_OPTIMIZERS: dict[str, tuple[str, str | None]] = {
    hf: (o.name, impl) for o in optimizer.REGISTRY for hf, impl in o.hf_optim
}

#: torch / bitsandbytes / torchao optimizer classes (torchtune ``optimizer._component_``): the registry's.
CLASS_OPTIMIZERS: dict[str, str] = {cls: o.name for o in optimizer.REGISTRY for cls in o.classes}

DTYPES = {
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "torch.float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "torch.float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
}


def dtype(v: Any) -> str | None:
    """``"bfloat16"``, ``"torch.bfloat16"``, ``torch.bfloat16`` -> ``"bf16"``; None if unknown."""
    return DTYPES.get(str(v).strip().lower()) if v is not None else None


def optimizer_from_hf(name: Any) -> tuple[str, str | None] | None:
    return HF_OPTIMIZERS.get(str(getattr(name, "value", name)).strip().lower())


def model_name(name: str) -> str:
    """A Hub id or torchtune name -> a cabe preset when obvious, else the text as given.

    ``meta-llama/Llama-3.1-8B`` (a preset's Hub id) and its ``-Instruct`` sibling (same
    architecture) map to the preset, so no download is needed; any other id is passed through.
    The mapping is :func:`cabe.models.preset_for_id`, the resolver every command uses.
    """
    return models.preset_for_id(str(name)) or str(name).strip()
