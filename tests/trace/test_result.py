"""TraceResult's JSON (derived from the dataclass fields) and its notes (catalog codes)."""

import json
import re
from pathlib import Path

from cabe.i18n import LANGS, catalog
from cabe.trace.result import TraceResult, note_text

KEYS = [
    "peak_bytes",
    "peak_gib",
    "peak_phase",
    "components",
    "phase_peaks",
    "parameters",
    "trainable_parameters",
    "reserved_bytes",
    "reserved_bytes_expandable_segments",
    "allocator_allocated_bytes",
    "segments",
    "paged_bytes",
    "first_step_peak_bytes",
    "host_bytes",
    "mode",
    "engine",
    "attention_kernels",
    "notes",
    "setup",
    "model",
    "steps",
    "micro_batches_per_step",
    "events",
    "peak_event",
    "step_starts",
    "seconds",
    "top_allocations",
    "timeline",
]


def _result() -> TraceResult:
    return TraceResult(
        peak_bytes=3 * 2**30,
        peak_phase="backward",
        components={"weights": 1},
        phase_peaks={"forward": 2},
        timeline=[(0, "forward", 5), (3, "backward", 7)],
        notes=["trace_eager_fallback", "trace_grad_accum_simulated"],
        setup={"attention": "sdpa", "grad_accum": 1000},
        seconds=1.5,
        alloc_sizes=[512],
        alloc_events=[1, -1],
    )


def test_json_keys_in_order_and_events_only_when_asked():
    res = _result()
    out = res.to_json()
    assert list(out) == KEYS
    assert out["peak_gib"] == 3.0 and out["timeline"] == [[0, "forward", 5], [3, "backward", 7]]
    assert list(res.to_json(include_events=True))[-2:] == ["alloc_sizes", "alloc_events"]


def test_notes_are_codes_rendered_in_english_in_the_json():
    out = _result().to_json()
    assert out["notes"] == [
        "sdpa attention is not supported by this architecture; used eager",
        "grad_accum=1000: simulated 2 micro-batches per step (memory is the same for every micro-batch after the first)",
    ]
    assert "note_codes" not in out
    es = _result().note_texts("es")
    assert es[0] != out["notes"][0] and "1.000" in es[1]


def test_round_trip_through_the_worker_form():
    res = _result()
    wire = json.loads(json.dumps(res.to_json(include_events=True, note_codes=True)))
    assert TraceResult.from_json(wire) == res


def test_every_note_code_has_a_sentence():
    src = Path(__file__).resolve().parents[2] / "src" / "cabe" / "trace"
    codes = set()
    for path in src.glob("*.py"):
        codes |= set(re.findall(r'notes\.append\("(\w+)"\)', path.read_text()))
    assert codes >= {"trace_eager_fallback", "trace_lora_all_linear", "trace_grad_accum_simulated", "trace_grad_scaler"}
    for lang in LANGS:
        for code in codes:
            assert "note." + code in catalog(lang), (lang, code)
    assert note_text("an older sentence", {}) == "an older sentence"


def test_every_optimizer_names_a_trace_factory_that_exists():
    import importlib

    from cabe.optimizer import REGISTRY

    for o in REGISTRY:
        if not o.trace_factory:  # modelled from its library's source, not traced (the report says so)
            continue
        module, _, name = o.trace_factory.partition(":")
        assert callable(getattr(importlib.import_module(module), name, None)), (o.name, o.trace_factory)
