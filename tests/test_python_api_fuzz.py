"""Fuzzing the Python API's arguments (hypothesis): whatever Python values the request fields get, ``cabe.estimate``,
``cabe.fit``, ``cabe.infer`` and ``cabe.lora`` answer or raise a :class:`cabe.CabeError` — never a bare ValueError,
TypeError, OverflowError ... — and the error's sentence can be written (``str``, both languages)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cabe
from cabe import schema

#: small presets (a fit or an infer of each takes milliseconds), a dense, an MoE, a hybrid
MODELS = ("llama-3.2-1b", "qwen2.5-0.5b", "gpt2", "qwen3-30b-a3b", "granite-4.0-h-1b")

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, 1, 2, 3, 7, 64, 2**63])
    | st.builds(lambda: 10**5000)  # past str()'s digit limit: its error must still be written
    | st.builds(lambda: -(10**5000))
    | st.floats()  # NaN and infinities included
    | st.text(max_size=12)
    | st.sampled_from(["", "0", "1e400", "nan", "inf", "-1", "all-linear", "q_proj,v_proj", "bf16", "fsdp", "both"])
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=6), inner, max_size=3)
        | st.sets(st.integers(), max_size=2)
        | st.just(b"bytes")
        | st.just(object())
    ),
    max_leaves=6,
)


def _choices(command: str) -> dict[str, st.SearchStrategy]:
    """A field's own values half of the time (so that calls get past the first check), any value otherwise."""
    out: dict[str, st.SearchStrategy] = {}
    for f in schema.fields_for(command, output=False):
        if f.name in ("model", "config"):
            continue
        own = f.allowed() if f.type is str or f.type is tuple else None
        if own:
            out[f.name] = st.sampled_from(own) | _values
        elif f.type is bool:
            out[f.name] = st.booleans() | _values
        elif f.type is int and f.minimum is not None:  # in range: past the first check, into the core
            out[f.name] = st.integers(int(f.minimum), int(min(f.maximum or 1 << 16, 1 << 16))) | _values
        else:
            out[f.name] = _values
    return out


def _kwargs(command: str) -> st.SearchStrategy:
    fields = _choices(command)
    fields.pop("params", None)  # with a model: model_and_params, every time
    names = st.lists(st.sampled_from(sorted(fields)), max_size=5, unique=True)
    return names.flatmap(lambda ns: st.fixed_dictionaries({n: fields[n] for n in ns}))


#: good ``lang`` / ``units`` (bad ones stop a call before the core: tests/test_python_api.py checks them)
_output = st.fixed_dictionaries({}, optional={"lang": st.sampled_from(["en", "es"]), "units": st.sampled_from(["GiB"])})


def _call(fn, model, kwargs, output) -> None:
    try:
        answer = fn(model, **kwargs, **output)
    except cabe.CabeError as e:
        assert str(e) and e.to_dict("es")["message"] and e.code
        return
    text = str(answer)  # the answer can be written
    assert text and len(repr(answer)) < 200
    if isinstance(answer, dict):
        for v in answer.values():
            assert not (isinstance(v, float) and math.isnan(v))


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(model=st.sampled_from(MODELS), kwargs=_kwargs("api.estimate"), output=_output)
def test_estimate_raises_only_cabe_errors(model, kwargs, output):
    _call(cabe.estimate, model, kwargs, output)


@SETTINGS
@given(
    model=st.sampled_from(MODELS),
    kwargs=_kwargs("api.fit"),
    gpu=st.sampled_from(["l4", "rtx-4090", "h100-80gb"]) | _values,
    output=_output,
)
def test_fit_raises_only_cabe_errors(model, kwargs, gpu, output):
    kwargs["gpu"] = gpu
    _call(cabe.fit, model, kwargs, output)


@SETTINGS
@given(model=st.sampled_from(MODELS), kwargs=_kwargs("api.infer"), output=_output)
def test_infer_raises_only_cabe_errors(model, kwargs, output):
    _call(cabe.infer, model, kwargs, output)


@SETTINGS
@given(model=st.sampled_from(MODELS) | _values, kwargs=_kwargs("api.lora"), output=_output)
def test_lora_raises_only_cabe_errors(model, kwargs, output):
    if isinstance(model, str) and ("/" in model or "\\" in model or model.startswith((".", "~"))):
        model = "gpt2"  # no Hub fetch, no file read
    _call(cabe.lora, model, kwargs, output)


@pytest.mark.parametrize("fn", [cabe.estimate, cabe.fit, cabe.infer, cabe.lora, cabe.trace])
@pytest.mark.parametrize("model", [None, 3, 10**500, ["llama-3.2-1b"], b"gpt2", "", "no-such-model"])
def test_bad_models_are_typed_errors(fn, model):
    with pytest.raises(cabe.CabeError):
        fn(model, gpu="l4") if fn in (cabe.fit,) else fn(model)


@SETTINGS
@given(
    command=st.sampled_from(["trace", "api.infer", "api.estimate", "api.fit"]),
    data=st.data(),
)
def test_trace_arguments_are_checked_with_typed_errors(command, data):
    # cabe.trace checks its Python values with cabe.request_check before torch loads; a trace is too slow to fuzz,
    # the check is not
    from cabe.request_check import check_values

    kwargs = data.draw(_kwargs(command))
    try:
        check_values(kwargs, command)
    except cabe.CabeError as e:
        assert str(e) and e.to_dict("es")["message"]
