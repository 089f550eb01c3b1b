"""The public Python API, pinned: names, ``cabe.estimate``'s signature, Report methods, and the
notebook display. ``to_json()`` is the CLI's ``--json`` object."""

from __future__ import annotations

import inspect
import json

import pytest

import cabe
from cabe.cli import main
from cabe.report.html import report_html

EXPECTED_ALL = [
    "estimate",
    "fit",
    "infer",
    "lora",
    "trace",
    "Report",
    "Answer",
    "Step",
    "TrainingSetup",
    "GB",
    "GiB",
    "CabeError",
    "InvalidValueError",
    "UnknownPresetError",
    "ConfigError",
    "HubError",
    "MissingDependencyError",
    "__version__",
]


def test_public_names_are_pinned():
    assert cabe.__all__ == EXPECTED_ALL
    for name in cabe.__all__:
        assert hasattr(cabe, name), name


@pytest.mark.parametrize("name", ["estimate", "fit", "infer", "lora", "trace"])
def test_signatures(name):
    fn = getattr(cabe, name)
    sig = inspect.signature(fn.__call__ if name == "trace" else fn)
    assert list(sig.parameters) == ["model", "options"]
    assert sig.parameters["model"].default is None
    assert sig.parameters["model"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert sig.parameters["options"].kind is inspect.Parameter.VAR_KEYWORD


def test_estimate_stays_callable_after_use():
    # A submodule named like the function would rebind the package attribute cabe.estimate on its
    # first import; the analytic core therefore lives in cabe/analytic.py. Pinned here.
    import subprocess
    import sys

    code = (
        "import cabe; cabe.estimate(params=7, bytes_per_param=16); "
        "print(callable(cabe.estimate)); cabe.estimate(params=7, bytes_per_param=16)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-400:]


def test_estimate_reads_like_the_cli():
    r = cabe.estimate(model="llama-3.1-8b", method="qlora", batch=4, seq=2048)
    assert isinstance(r, cabe.Report)
    assert isinstance(r.total_bytes, int) and r.total_bytes > 0
    assert sum(r.components.values()) == r.total_bytes
    assert {"weights", "activations", "optimizer", "gradients"} <= set(r.components)
    assert r.reserved_bytes >= r.total_bytes and r.device_bytes >= r.reserved_bytes
    assert r.setup["method"] == "qlora" and r.setup["batch"] == 4 and r.setup["seq"] == 2048


def test_explain_in_spanish():
    r = cabe.estimate(model="llama-3.1-8b", method="lora", batch=2, seq=1024)
    es, en = r.explain(lang="es"), r.explain(lang="en")
    assert es != en and es.strip() and "Explain" not in es


@pytest.mark.parametrize(
    "options,argv",
    [
        (
            {"model": "llama-3.1-8b", "method": "qlora", "batch": 4, "seq": 2048},
            ["--model", "llama-3.1-8b", "--method", "qlora", "--batch", "4", "--seq", "2048"],
        ),
        (
            {"params": 7, "bytes_per_param": 16, "activations_gb": 20},
            ["--params", "7", "--bytes-per-param", "16", "--activations-gb", "20"],
        ),
        (
            {
                "model": "qwen2.5-0.5b",
                "precision": "bf16-amp",
                "optimizer": "adamw-8bit",
                "checkpointing": True,
                "gpu": "rtx-4090",
            },
            [
                "--model",
                "qwen2.5-0.5b",
                "--precision",
                "bf16-amp",
                "--optimizer",
                "adamw-8bit",
                "--checkpointing",
                "--gpu",
                "rtx-4090",
            ],
        ),
    ],
)
def test_to_json_equals_the_cli_json(capsys, options, argv):
    r = cabe.estimate(**options)
    data = r.to_json()
    assert json.loads(json.dumps(data)) == data  # JSON-serialisable, unchanged by a round trip
    assert main(["estimate", *argv, "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    cli.pop("fits_on")  # the CLI adds the fits table; the rest is the report's to_json()
    assert cli == data


def test_bad_input_raises_a_coded_error():
    with pytest.raises(cabe.CabeError) as e:
        cabe.estimate(model="llama-3.1-8b", batch=0)
    assert e.value.code == "out_of_range" and e.value.field == "batch"
    with pytest.raises(cabe.UnknownPresetError):
        cabe.estimate(model="no-such-model")


def test_report_html_has_the_components_and_an_inline_bar():
    r = cabe.estimate(model="llama-3.1-8b", method="qlora", batch=4, seq=2048)
    html = report_html(r)
    assert html.count("<svg") == 1 and "<rect" in html
    for label in ("weights", "optimizer state", "activations", "logits and loss"):
        assert label in html
    from cabe.units import fmt_bytes

    gb, gib = fmt_bytes(r.total_bytes, "en", "GB", both=False), fmt_bytes(r.total_bytes, "en", "GiB", both=False)
    assert gb in html and gib in html  # the same figures as `cabe estimate`
    assert "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # no network assets
    assert "<script" not in html
    es = report_html(r, lang="es")
    assert "pesos" in es and fmt_bytes(r.total_bytes, "es", "GB", both=False) in es


def test_report_html_for_seed_mode():
    html = report_html(cabe.estimate(params=7, bytes_per_param=16, activations_gb=20))
    assert "132 GB" in html and "122.9 GiB" in html


def test_repr_html_uses_report_html_when_wired():
    r = cabe.estimate(params=7, bytes_per_param=16)
    assert r._repr_html_() == report_html(r)


# ---- issue 32, item 6: fit, infer, lora, trace; str / repr; typed errors ------------------------------------------

import sys  # noqa: E402

from cabe import api, schema  # noqa: E402
from cabe.i18n import error_message  # noqa: E402
from cabe.units import fmt_bytes  # noqa: E402

FIT = {"model": "llama-3.2-1b", "method": "lora", "gpu": "rtx-4090", "batch": 2, "seq": 1024}
FIT_ARGV = ["--model", "llama-3.2-1b", "--method", "lora", "--gpu", "rtx-4090", "--batch", "2", "--seq", "1024"]
INFER = {"model": "llama-3.1-8b", "gpu": "h100-80gb", "context": 8192, "batch": 4}
INFER_ARGV = ["--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--context", "8192", "--batch", "4"]


def _cli(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_str_of_a_report_is_what_cabe_estimate_prints(capsys):
    argv = ["--model", "llama-3.1-8b", "--method", "qlora", "--batch", "4", "--seq", "2048"]
    r = cabe.estimate(model="llama-3.1-8b", method="qlora", batch=4, seq=2048)
    assert str(r) == _cli(capsys, "estimate", *argv).rstrip("\n")
    es = cabe.estimate(model="llama-3.1-8b", method="qlora", batch=4, seq=2048, lang="es", units="GiB")
    assert str(es) == _cli(capsys, "estimate", *argv, "--lang", "es", "--units", "GiB").rstrip("\n")
    assert r.text(lang="es", units="GiB") == str(es)
    simple = cabe.estimate(params=7, bytes_per_param=16)
    assert str(simple) == _cli(capsys, "estimate", "--params", "7", "--bytes-per-param", "16").rstrip("\n")


def test_repr_is_short():
    r = cabe.estimate(model="llama-3.1-8b", method="qlora", batch=4, seq=2048)
    assert repr(r) == f"Report(model='llama-3.1-8b', total='{fmt_bytes(r.total_bytes, 'en', both=False)}')"
    # the seed's simple mode: 7e9 parameters × 16 B = 112 GB, no model named
    assert repr(cabe.estimate(params=7, bytes_per_param=16)) == "Report(mode='simple', total='112 GB')"
    for answer in (cabe.fit(**FIT), cabe.infer(**INFER), cabe.lora("llama-3.1-8b")):
        assert len(repr(answer)) < 100 and "\n" not in repr(answer)
        assert repr(answer).startswith(answer.command.capitalize() + "(")
    inf = cabe.infer(**INFER)
    assert repr(inf) == f"Infer(model='llama-3.1-8b', total='{fmt_bytes(inf['total_bytes'], 'en', both=False)}')"


def test_fit_is_cabe_fit(capsys):
    out = cabe.fit(**FIT)
    assert isinstance(out, dict) and isinstance(out, cabe.Answer)
    assert json.loads(json.dumps(out)) == out
    cli = json.loads(_cli(capsys, "fit", *FIT_ARGV, "--json"))
    out.pop("elapsed_ms"), cli.pop("elapsed_ms")
    assert cli == out
    text = _cli(capsys, "fit", *FIT_ARGV, "--lang", "es")
    assert str(cabe.fit(**FIT, lang="es")).splitlines()[:-1] == text.splitlines()[:-1]  # all but "Solved in .. ms"


def test_fit_takes_the_price(capsys):
    out = cabe.fit(**FIT, tokens=1e9, price_per_gpu_hour=2.0)
    assert out["time"]["for"] == "now" and out["time"]["cost"] == pytest.approx(2.0 * out["time"]["gpu_hours"])
    argv = [*FIT_ARGV, "--tokens", "1e9", "--price-per-gpu-hour", "2"]
    assert str(out).splitlines()[:-1] == _cli(capsys, "fit", *argv).splitlines()[:-1]


def test_infer_is_cabe_infer(capsys):
    out = cabe.infer(**INFER)
    assert json.loads(_cli(capsys, "infer", *INFER_ARGV, "--json")) == json.loads(json.dumps(out))
    assert str(out) == _cli(capsys, "infer", *INFER_ARGV).rstrip("\n")


def test_lora_is_api_lora_and_prints_as_cabe_lora(capsys):
    out = cabe.lora("llama-3.1-8b", lora_rank=16, lora_targets=["q_proj", "k_proj", "v_proj"])
    assert out == api.lora_json({"model": "llama-3.1-8b", "lora_rank": 16, "lora_targets": "q_proj,k_proj,v_proj"})
    argv = ["lora", "--model", "llama-3.1-8b", "--lora-rank", "16", "--lora-targets", "q_proj,k_proj,v_proj"]
    assert str(out) == _cli(capsys, *argv).rstrip("\n")


@pytest.mark.parametrize(
    "name,command",
    [("estimate", "api.estimate"), ("fit", "api.fit"), ("infer", "api.infer"), ("lora", "api.lora")],
)
def test_keywords_are_the_schema_fields(name, command):
    # an unknown keyword is refused, and the sentence lists the fields the schema declares for the command
    with pytest.raises(cabe.InvalidValueError) as e:
        getattr(cabe, name)(model="llama-3.2-1b", **({} if name == "lora" else {"gpu": "l4"}), no_such_field=1)
    assert e.value.code == "unknown_field" and e.value.field == "no_such_field"
    allowed = set(e.value.params["allowed"].split(", ")) - {"lang", "units"}
    assert allowed == set(schema.names(command))


def test_trace_fields_are_the_schema_fields():
    with pytest.raises(cabe.InvalidValueError) as e:
        cabe.trace("llama-3.2-1b", no_such_field=1)
    assert set(e.value.params["allowed"].split(", ")) == set(schema.names("trace"))
    for bad, code in (({"steps": 1}, "out_of_range"), ({"steps": "2"}, "not_integer"), ({"mode": "x"}, "bad_choice")):
        with pytest.raises(cabe.InvalidValueError) as e:
            cabe.trace("llama-3.2-1b", **bad)
        assert e.value.code == code


def test_trace_is_the_package_and_callable():
    import cabe.trace as package

    assert cabe.trace is package and callable(cabe.trace)
    assert cabe.trace.trace_step is package.trace_step  # the package's names still read through it
    code = "import cabe; print(callable(cabe.trace)); import cabe.trace; print(callable(cabe.trace))"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True"], out.stderr[-400:]


def test_trace_without_the_extra_is_a_missing_dependency(monkeypatch):
    monkeypatch.setitem(sys.modules, "cabe.trace.cli", None)  # what `import` meets without torch
    # and not bound on the package by an earlier test (`from cabe.trace import cli` reads the attribute first)
    monkeypatch.delattr(sys.modules["cabe.trace"], "cli", raising=False)
    with pytest.raises(cabe.MissingDependencyError) as e:
        cabe.trace("llama-3.2-1b", method="lora")
    assert e.value.code == "missing_extra" and "trace" in str(e.value)


def test_str_of_an_error_is_its_sentence():
    with pytest.raises(cabe.CabeError) as e:
        cabe.estimate(model="llama-3.1-8b", batch=10**5000)  # raised a bare ValueError while making its message
    assert type(e.value) is cabe.InvalidValueError and e.value.code == "out_of_range"
    assert str(e.value) == error_message(e.value, "en") == "batch must be between 1 and 1,048,576, got 10^4999."
    assert repr(e.value) == "InvalidValueError(code='out_of_range', field='batch')"
    import pickle

    back = pickle.loads(pickle.dumps(e.value))
    assert (type(back), back.code, back.field, dict(back.params)) == (
        type(e.value),
        e.value.code,
        e.value.field,
        dict(e.value.params),
    )


@pytest.mark.parametrize("name", ["estimate", "fit", "infer", "lora"])
@pytest.mark.parametrize("bad", [{"lang": "xx"}, {"lang": 3}, {"units": "TB"}, {"units": None, "lang": ""}])
def test_lang_and_units_are_checked(name, bad):
    call = {"model": "llama-3.2-1b", "gpu": "l4"} if name in ("fit", "infer") else {"model": "llama-3.2-1b"}
    if bad == {"units": None, "lang": ""}:  # not given: the defaults
        getattr(cabe, name)(**call, **bad)
        return
    with pytest.raises(cabe.InvalidValueError) as e:
        getattr(cabe, name)(**call, **bad)
    assert e.value.code == "bad_choice" and e.value.field in ("lang", "units")


def test_big_numbers_are_typed_errors():
    for name, call in (
        ("estimate", {"model": "llama-3.1-8b"}),
        ("fit", {"model": "llama-3.2-1b", "gpu": "l4"}),
        ("infer", {"model": "llama-3.2-1b"}),
    ):
        for field in ("batch", "seq", "context", "tokens", "price_per_gpu_hour", "mfu", "activations_gb"):
            try:
                getattr(cabe, name)(**call, **{field: 10**5000})
            except cabe.CabeError as e:
                assert str(e) and e.to_dict("es")["message"]
