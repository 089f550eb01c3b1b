"""Hostile and careless files, flags and numbers on the command line: one sentence naming the field,
exit 2, never "Internal error" (exit 1), and no ``NaN`` / ``Infinity`` in ``--json`` (issue 12)."""

from __future__ import annotations

import json

import pytest

from cabe.cli import main

LLAMA = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
}


def _config(tmp_path, text: str, name: str = "config.json") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _run(argv, capsys):
    rc = main(argv + ["--lang", "en"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Internal error" not in err, err
    return rc, out, err


@pytest.mark.parametrize(
    "text,needle",
    [
        (
            json.dumps({**LLAMA, "num_hidden_layers": 10**300}),
            "'num_hidden_layers' in the config.json has more than 300",
        ),
        # a config.json may hold non-finite numbers (transformers reads them with Python's json); where cabe reads
        # one as a size, the reader refuses it by name
        (json.dumps(LLAMA).replace("4096", "NaN", 1), "bad value for 'hidden_size': nan"),
        (json.dumps(LLAMA).replace("4096", "1e999", 1), "bad value for 'hidden_size': inf"),
        (json.dumps(LLAMA).replace("4096", "9" * 5000, 1), "more than 300 digits"),
        ("[" * 100_000 + "]" * 100_000, "nests more than 64 levels"),
        # 10^12 wide: 10^24 parameters, beyond the 10^15 bound
        (json.dumps({**LLAMA, "hidden_size": 10**12}), "describes more than 1,000,000,000,000,000 parameters"),
    ],
)
def test_hostile_config_json(tmp_path, capsys, text, needle):
    rc, _, err = _run(["estimate", "--model", _config(tmp_path, text), "--json"], capsys)
    assert rc == 2 and needle in err, err


def test_non_finite_numbers_cabe_does_not_read_are_accepted(tmp_path, capsys):
    """Falcon-H1's and Mamba's Hub configs hold ``"time_step_limit": [0.0, Infinity]``: the estimate is the same as
    without it, and the --json answer stays strict JSON."""
    plain = json.dumps(LLAMA)
    with_inf = plain[:-1] + ', "time_step_limit": [0.0, Infinity]}'
    rc, out, err = _run(["estimate", "--model", _config(tmp_path, with_inf), "--json"], capsys)
    assert rc == 0, err
    total = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in --json"))["total_bytes"]
    (tmp_path / "plain").mkdir()
    rc, out, err = _run(["estimate", "--model", _config(tmp_path / "plain", plain), "--json"], capsys)
    assert rc == 0 and json.loads(out)["total_bytes"] == total


def test_a_device_is_refused_at_once(capsys):
    """``/dev/zero`` has size 0 and never ends: refused before any read, in one sentence."""
    rc, _, err = _run(["estimate", "--model", "/dev/zero"], capsys)
    assert rc == 2 and "is not a regular file" in err, err


def test_file_name_too_long_is_not_found(capsys):
    rc, _, err = _run(["estimate", "--model", "x" * 5000 + ".json"], capsys)
    assert rc == 2 and "no config.json at 'xxx" in err and len(err) < 300  # the name is cut, not echoed whole
    rc, _, err = _run(["estimate", "--model", "y" * 5000], capsys)  # not .json: tried as a preset
    assert rc == 2 and "unknown preset" in err


def test_deep_yaml_and_bad_target_modules(tmp_path, capsys):
    rc, _, err = _run(["from-config", _config(tmp_path, "a: " + "[" * 5000 + "]" * 5000, "x.yaml")], capsys)
    assert rc == 2 and "nests more than 64 levels" in err
    peft = _config(tmp_path, json.dumps({"peft_type": "LORA", "r": 8, "target_modules": 5}), "adapter_config.json")
    rc, _, err = _run(["from-config", peft], capsys)
    assert rc == 2 and "target-modules: '5' is not valid here; expected a list of module names" in err


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["estimate", "--params", "1" * 5000, "--bytes-per-param", "2"], "params must be a finite number"),
        (["estimate", "--params", "7", "--bytes-per-param", "2", "--activations-gb", "1e999"], "finite number"),
        (["estimate", "--params", "7", "--bytes-per-param", "1e308"], "got 1e+308"),
        (["estimate", "--model", "llama-7b", "--batch", "9" * 5000], "batch must be a whole number"),
        (["estimate", "--model", "llama-7b", "--lang", "xx"], "lang: 'xx' is not allowed; choose one of: en, es"),
    ],
)
def test_huge_and_non_finite_numbers(capsys, argv, needle):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err) < 400, err


def test_json_output_is_strict(capsys):
    """Every --json answer parses with a parser that refuses NaN / Infinity."""

    def strict(text: str):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-finite {c} in output"))

    for argv in (
        ["estimate", "--model", "llama-7b", "--json"],
        ["estimate", "--params", "7", "--json"],
        ["infer", "--model", "llama-7b", "--json"],
        ["estimate", "--model", "llama-7b", "--batch", "0", "--json"],  # the error object too
    ):
        main(argv)
        strict(capsys.readouterr().out)


def test_python_api_refuses_unknown_units():
    import cabe
    from cabe.errors import InvalidValueError
    from cabe.report.text import format_report

    report = cabe.estimate(model="llama-7b")
    with pytest.raises(InvalidValueError) as e:
        format_report(report, units="TB")
    assert (e.value.code, e.value.field) == ("bad_choice", "units")
    with pytest.raises(InvalidValueError):
        report.explain(lang="xx")


def test_format_that_contradicts_the_content(capsys):
    rc, _, err = _run(["from-config", "--format", "torchtune", "tests/configs/files/ds_zero2.json"], capsys)
    assert rc == 2 and "looks like a deepspeed config, not torchtune" in err


def test_from_config_refuses_a_device_at_once(capsys):
    """``cabe from-config /dev/zero`` read forever before: refused before any read, in one sentence."""
    rc, _, err = _run(["from-config", "/dev/zero"], capsys)
    assert rc == 2 and "is not a regular file" in err, err
