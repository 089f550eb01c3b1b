"""``POST /api/from-config``: the configs a run already has, sent as their texts, read as ``cabe from-config`` reads
its files (:mod:`cabe.from_config`, :mod:`cabe.configs`: the same readers, the same 1 MiB limit per file, the same
typed errors), never written to the disk, executed or kept.

The body is JSON — ``{"files": [{"name": "ds_config.json", "text": "..."}], "format": ..., "gpu": ...}`` and any
override ``cabe from-config`` takes as a flag (its schema fields) — or ``multipart/form-data`` with the files as
``files`` parts and the other fields as text parts. The answer is ``cabe from-config --json``'s object; a set of
files that reads but whose estimate fails (no model in them, say) answers 422 with the error and, beside it,
``from_config``: what the files said (the page fills its form from it all the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from email import policy
from email.parser import BytesParser
from typing import Any

from cabe import from_config, jsonio, schema
from cabe.configs import FORMATS, ConfigText
from cabe.configs._base import MAX_BYTES
from cabe.errors import CabeError, ConfigError, InvalidValueError
from cabe.web.form import request_value

#: most files one request may carry (a run has a handful: training arguments, adapter, DeepSpeed, accelerate)
MAX_FILES = 8
#: most parts a multipart body may have (the files and the override fields)
MAX_PARTS = 64
#: the largest body: every file at its limit, as JSON text (escaping can double it), and the fields
MAX_UPLOAD_BYTES = 2 * MAX_FILES * MAX_BYTES + 64 * 1024
#: the keys of the body besides the overrides (``cabe from-config``'s ``FILE...`` and ``--format``)
OWN_KEYS = ("files", "format")
COMMAND = "from-config"


class BadUpload(Exception):
    """A multipart body that does not parse."""


def accepted() -> tuple[str, ...]:
    return OWN_KEYS + schema.accepted(COMMAND)


def from_json(body: Any) -> tuple[list[ConfigText], str | None, dict[str, Any]]:
    """The files, the format and the other fields of a JSON body."""
    if not isinstance(body, Mapping):
        raise InvalidValueError("body_not_object", None)
    for key in body:
        if key not in accepted():
            raise InvalidValueError("unknown_field", key, allowed=", ".join(accepted()))
    files = body.get("files")
    if files is None or files == []:
        raise ConfigError("cfg_no_files", "files")
    if not isinstance(files, list) or not all(_is_file(f) for f in files):
        raise InvalidValueError("cfg_bad_upload", "files")
    _count(len(files))
    items = [ConfigText(f["name"], f["text"]) for f in files]
    return items, _format(body.get("format")), {k: v for k, v in body.items() if k not in OWN_KEYS}


def _is_file(f: Any) -> bool:
    return (
        isinstance(f, Mapping)
        and set(f) <= {"name", "text"}
        and all(isinstance(f.get(k), str) for k in f)
        and ("text" in f and bool(str(f.get("name", "")).strip()))
    )


def _count(n: int) -> None:
    if n > MAX_FILES:
        raise ConfigError("cfg_too_many_files", "files", count=n, limit=MAX_FILES)


def _format(fmt: Any) -> str | None:
    if fmt is None or fmt == "":
        return None
    if not isinstance(fmt, str):
        raise ConfigError("cfg_bad_format", "format", value=str(fmt)[:50], allowed=", ".join(FORMATS))
    return fmt


def from_multipart(raw: bytes, content_type: str) -> tuple[list[ConfigText], str | None, dict[str, Any]]:
    """The files (``files`` parts), the format and the other fields (text parts, converted as the page's form
    fields are) of a ``multipart/form-data`` body, parsed by the standard library's MIME parser."""
    head = b"MIME-Version: 1.0\r\nContent-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n"
    try:
        msg = BytesParser(policy=policy.HTTP).parsebytes(head + raw)
        parts = list(msg.iter_parts()) if msg.is_multipart() else None
    except Exception:  # the standard parser's own errors on a broken body
        raise BadUpload() from None
    if not parts or len(parts) > MAX_PARTS:
        raise BadUpload()
    files: list[ConfigText] = []
    fields: dict[str, Any] = {}
    for part in parts:
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if not isinstance(name, str) or not isinstance(payload, bytes):
            raise BadUpload()
        if name == "files":
            filename = part.get_filename() or f"file{len(files) + 1}"
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    "cfg_malformed", "file", path=filename[:120], kind="text", detail=str(exc)[:200]
                ) from None
            files.append(ConfigText(filename, text))
            continue
        fields[name] = payload.decode("utf-8", "replace")
    body = {"files": [{"name": f.name, "text": f.text} for f in files], **fields}
    items, fmt, rest = from_json(body)
    return items, fmt, _typed(rest)


def _typed(fields: Mapping[str, str]) -> dict[str, Any]:
    """Text fields as the request's values (as the page's form sends them: cabe.web.form.request_value)."""
    out: dict[str, Any] = {}
    for k, v in fields.items():
        if k in ("lang", "units"):
            out[k] = v
        elif v.strip() or schema.field(k, COMMAND).type is bool:
            out[k] = request_value(schema.field(k, COMMAND), v)
    return out


def answer(items: list[ConfigText], fmt: str | None, fields: Mapping[str, Any], lang: str) -> tuple[int, Any]:
    """(status, JSON) of a request: ``cabe from-config --json``'s object; 422 with the error (and what the files
    said, when they were read) when something is wrong."""
    overrides = {k: v for k, v in fields.items() if k not in ("gpu", "lang", "units")}
    try:
        combined = from_config.read(items, fmt=fmt, overrides=overrides)
    except CabeError as err:
        return 422, {"error": err.to_dict(lang)}
    gpu = fields.get("gpu")
    try:
        report = from_config.build(combined, gpu=gpu, allow_files=False, trace="worker")
    except CabeError as err:
        return 422, {"error": err.to_dict(lang), "from_config": from_config.from_config_json(combined, lang)}
    return 200, from_config.answer_json(combined, report, lang)


def parse(raw: bytes, content_type: str) -> tuple[list[ConfigText], str | None, dict[str, Any]]:
    """The request from a JSON or multipart body (``BadUpload``, or the typed errors of strict JSON)."""
    if content_type.lower().startswith("multipart/form-data"):
        return from_multipart(raw, content_type)
    return from_json(jsonio.loads(raw, "body") if raw.strip() else {})
