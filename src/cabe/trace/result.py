"""What a trace measured (:class:`TraceResult`) and its JSON form, derived from the dataclass fields.

``notes`` are codes (``trace_eager_fallback``...); their sentences live in the catalogs
(``i18n/<lang>/trace.json``, keys ``note.<code>``, placeholders filled from the setup) and the JSON
carries them rendered in English, as it always has. The worker protocol adds ``note_codes``.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from cabe.i18n import DEFAULT_LANG, catalog, text


def note_text(code: str, setup: dict[str, Any], lang: str = DEFAULT_LANG, *, localize: bool = True) -> str:
    """The sentence of a trace note; ``localize=False`` fills numbers as Python prints them (the JSON).
    A note that is not a catalog code (an older worker's sentence) is returned as it is."""
    key = "note." + code
    if key not in catalog(DEFAULT_LANG):
        return code
    params = dict(setup) if localize else {k: str(v) for k, v in setup.items()}
    return text(key, lang, params)


def _copy(v: Any) -> Any:
    if isinstance(v, dict):
        return dict(v)
    if isinstance(v, (list, tuple)):
        return list(v)
    return v


def _meta(json: str | None = None, **kw: Any) -> dict[str, Any]:
    return {"json": json, **kw}


@dataclass
class TraceResult:
    """What :func:`~cabe.trace.trace_step` measured. All byte counts are per GPU.

    The field order is the key order of :meth:`to_json`; ``metadata`` says a field's JSON name
    (``json``), how it is written (``encode``) and read back (``decode``), and whether it travels only
    with the events (``events``).
    """

    peak_bytes: int = field(metadata=_meta(derived=("peak_gib", lambda v: round(v / 2**30, 4))))
    peak_phase: str
    components: dict[str, int]
    phase_peaks: dict[str, int]
    parameters: int = 0
    trainable_parameters: int = 0
    reserved_bytes: int = 0
    reserved_bytes_expandable: int = field(default=0, metadata=_meta("reserved_bytes_expandable_segments"))
    allocator_allocated_bytes: int = 0  # max_memory_allocated() incl. unsplit block remainders
    segments: int = 0
    paged_bytes: int = 0
    first_step_peak_bytes: int = 0
    # host (CPU) memory of the GPU's process, the most live at once in the last step: FSDP2's CPU offload keeps the
    # sharded parameters, gradients and optimizer state there (cabe.trace.distributed); 0 where nothing is offloaded
    host_bytes: int = 0
    mode: str = "fake"
    # several GPUs (cabe.trace.distributed): the engine that ran, its version, wrapping, mesh and world size
    engine: dict[str, Any] = field(default_factory=dict)
    attention_kernels: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # codes: note_text() says them
    setup: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)  # the built model's facts (build.model_facts)
    steps: int = 2
    micro_batches_per_step: int = 1
    events: int = 0
    peak_event: int = 0
    step_starts: list[int] = field(default_factory=list)
    seconds: float = field(default=0.0, metadata=_meta(encode=lambda v: round(v, 3)))
    top_allocations: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[tuple[int, str, int]] = field(
        default_factory=list,
        metadata=_meta(encode=lambda v: [list(t) for t in v], decode=lambda v: [tuple(t) for t in v]),
    )
    alloc_sizes: list[int] | None = field(default=None, metadata=_meta(events=True))  # allocation id -> bytes
    alloc_events: list[int] | None = field(default=None, metadata=_meta(events=True))  # +id+1 malloc, -(id+1) free

    def note_texts(self, lang: str = DEFAULT_LANG, *, localize: bool = True) -> list[str]:
        """The notes as sentences in ``lang``."""
        return [note_text(code, self.setup, lang, localize=localize) for code in self.notes]

    def to_json(self, *, include_events: bool = False, note_codes: bool = False) -> dict[str, Any]:
        """The JSON object: every field (``notes`` as English sentences), ``peak_gib`` after
        ``peak_bytes``; the allocation events with ``include_events``, the note codes with ``note_codes``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("events"):
                if include_events and self.alloc_sizes is not None:
                    out[f.name] = list(value or [])
                continue
            key = f.metadata.get("json") or f.name
            if f.name == "notes":
                out[key] = self.note_texts(localize=False)
                if note_codes:
                    out["note_codes"] = list(value)
            else:
                encode = f.metadata.get("encode", _copy)
                out[key] = encode(value)
            derived = f.metadata.get("derived")
            if derived:
                out[derived[0]] = derived[1](value)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TraceResult:
        """The inverse of :meth:`to_json` (fields missing from ``d`` take their defaults)."""
        kw: dict[str, Any] = {}
        for f in fields(cls):
            key = f.metadata.get("json") or f.name
            if f.name == "notes" and "note_codes" in d:
                key = "note_codes"
            if key not in d:
                if f.default is MISSING and f.default_factory is MISSING:
                    raise KeyError(key)
                continue
            kw[f.name] = f.metadata.get("decode", _copy)(d[key])
        return cls(**kw)
