"""The request schema: one declaration, and everything that is derived from it agrees with it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import pytest

from cabe import schema, training
from cabe.errors import InvalidValueError
from cabe.i18n import LANGS, catalog


def test_names_are_unique_per_command() -> None:
    for command in schema.COMMANDS:
        names = [f.name for f in schema.fields_for(command)]
        assert len(names) == len(set(names)), command


def test_every_field_is_well_formed() -> None:
    for f in schema.FIELDS:
        assert f.group in schema.GROUPS, f.name
        assert f.commands and set(f.commands) <= set(schema.COMMANDS), f.name
        assert f.name == f.name.lower() and "-" not in f.name
        for flag in f.flags:
            assert flag.startswith("-"), f.name
        if f.choices is not None and f.default is not None and f.type is str:
            assert f.default in f.choices, f.name
        if f.type is int and f.default is not None:
            assert f.minimum is None or f.default >= f.minimum
            assert f.maximum is None or f.default <= f.maximum
        for lang in LANGS:
            assert f.key in catalog(lang), (lang, f.key)


def test_training_setup_is_the_schema() -> None:
    dc = {f.name: f for f in dataclasses.fields(training.TrainingSetup)}
    assert tuple(dc) == tuple(f.name for f in schema.SETUP_FIELDS)
    for f in schema.SETUP_FIELDS:
        assert dc[f.name].default == f.default, f.name
    hints = typing.get_type_hints(training.TrainingSetup)
    for f in schema.SETUP_FIELDS:
        if f.choices is not None and f.name != "optimizer":  # the registry's and the HF Trainer's names (below)
            literal = [a for a in typing.get_args(hints[f.name]) if a is not type(None)]
            args = typing.get_args(literal[0]) if len(literal) == 1 and typing.get_args(literal[0]) else literal
            assert tuple(args) == f.choices, f.name


def test_state_fields_are_the_cache_key() -> None:
    from cabe.analytic import states

    assert tuple(states._STATE_FIELDS) == schema.state_fields()
    assert "lora_alpha" not in schema.state_fields() and "batch" not in schema.state_fields()


def test_api_fields() -> None:
    from cabe import api

    assert schema.names("api.estimate") == api.REQUEST_FIELDS
    assert schema.names("api.fit") == api.REQUEST_FIELDS + ("solve", "mfu", "tokens", "price_per_gpu_hour")


def test_infer_fields_are_what_the_core_accepts() -> None:
    from cabe.inference import infer_json

    with pytest.raises(InvalidValueError) as err:
        infer_json({"model": "gpt2", "nope": 1})
    # NOTE: as sets: the core lists them in its own order (gpu after group_size) in the error message
    assert set(err.value.params["allowed"].split(", ")) == set(schema.names("api.infer", output=True))


def test_lazy_choices_are_the_core_catalogs() -> None:
    from cabe.kv_cache import KV_CHOICES
    from cabe.weights import FORMATS

    assert schema.field("weights", "infer").allowed() == FORMATS
    assert schema.field("kv_dtype", "infer").allowed() == KV_CHOICES


def test_field_lookup_by_command() -> None:
    assert schema.field("batch").maximum == schema.MAX_BATCH
    assert schema.field("batch", "infer").group == "serving"
    assert schema.field("mode", "trace").choices == ("auto", "fake", "meta")
    with pytest.raises(KeyError):
        schema.field("nope")
    with pytest.raises(KeyError):
        schema.fields_for("nope")


@pytest.mark.parametrize(
    ("given", "precision"),
    [
        # nothing given: what Trainer(bf16=True) does with a model loaded by transformers 5's defaults
        ({}, ("auto", "bf16", None)),
        ({"method": "lora"}, ("auto", "bf16", None)),
        ({"method": "lora", "precision": "fp32"}, ("fp32", "none", "fp32")),
        ({"method": "lora", "precision": ""}, ("auto", "bf16", None)),
        ({"method": "full", "precision": None}, ("auto", "bf16", None)),
        ({"precision": "bf16-amp"}, ("fp32", "bf16", "bf16-amp")),
        ({"precision": "bf16"}, ("bf16", "none", "bf16")),
        ({"precision": "bf16-mixed", "dtype": "bf16"}, ("bf16", "bf16", "bf16-mixed")),
        ({"dtype": "bf16", "autocast": "none"}, ("bf16", "none", None)),
    ],
)
def test_resolve_defaults_precision(given: dict, precision: tuple) -> None:
    out = schema.resolve_defaults(given)
    assert (out["dtype"], out["autocast"], out["precision"]) == precision
    assert set(out) == {f.name for f in schema.SETUP_FIELDS}
    assert out["seq"] == 512 and out["lora_targets"] == ()


def test_json_schema() -> None:
    assert schema.field("batch").json_schema() == {
        "type": "integer",
        "minimum": 1,
        "maximum": schema.MAX_BATCH,
        "default": 1,
    }
    assert schema.field("lora_alpha").json_schema()["exclusiveMinimum"] == 0
    assert schema.field("method").json_schema()["enum"] == list(training.METHODS)
    assert schema.field("lora_targets").json_schema()["type"] == "array"
    assert schema.field("config", "api.estimate").json_schema() == {"type": "object"}


def test_optimizer_choices_come_from_the_registry() -> None:
    from cabe import optimizer

    assert schema.field("optimizer").choices == optimizer.ACCEPTED == training.OPTIMIZERS
    assert optimizer.ACCEPTED[: len(optimizer.OPTIMIZERS)] == optimizer.OPTIMIZERS


def test_schema_imports_nothing_heavy() -> None:
    code = (
        "import sys, cabe.schema; "
        "heavy = [m for m in ('torch', 'pydantic', 'starlette', 'transformers', 'cabe.analytic') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_docs_options_is_generated_from_the_schema() -> None:
    """docs/options.md is `python -m cabe.schema --markdown`: regenerate it when a field changes."""
    from pathlib import Path

    doc = Path(__file__).resolve().parents[1] / "docs" / "options.md"
    assert doc.read_text(encoding="utf-8") == schema.markdown()


def test_precision_shorthand_contradicting_dtype_is_a_typed_error() -> None:
    from cabe.errors import InvalidValueError

    with pytest.raises(InvalidValueError) as e:
        schema.resolve_defaults({"precision": "bf16-amp", "dtype": "bf16"})
    assert e.value.code == "precision_conflict" and e.value.field == "dtype"
    with pytest.raises(InvalidValueError) as e:
        training.TrainingSetup(precision="bf16", autocast="fp16")
    assert e.value.code == "precision_conflict"
