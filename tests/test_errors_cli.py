"""Bad input: one clear sentence naming the field, exit code 2, never a traceback."""

import json
import subprocess
import sys

import pytest

from cabe.cli import main


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["estimate", "--params", "-7", "--bytes-per-param", "16"], "params must be greater than 0"),
        (["estimate", "--params", "0", "--bytes-per-param", "16"], "params must be greater than 0"),
        (["estimate", "--params", "nan", "--bytes-per-param", "16"], "params must be a finite number"),
        (["estimate", "--params", "7", "--bytes-per-param", "abc"], "bytes-per-param must be a number"),
        (["estimate", "--params", "1e9", "--bytes-per-param", "16"], "params must be between"),
        (["estimate", "--model", "llama-99b"], "unknown preset 'llama-99b'"),
        (["estimate", "--model", "llama-7b", "--batch", "0"], "batch must be between 1"),
        (["estimate", "--model", "llama-7b", "--batch", "two"], "batch must be a whole number"),
        (["estimate", "--model", "llama-7b", "--method", "dora"], "method: 'dora' is not allowed"),
        (["estimate", "--model", "llama-7b", "--method", "lora", "--lora-targets", "c_attn"], "has no module 'c_attn'"),
        (["estimate", "--model", "llama-7b", "--gpu", "rtx-9999"], "unknown card 'rtx-9999'"),
        (["estimate", "--model", "llama-7b", "--params", "7"], "either a model or a parameter count"),
        (["estimate"], "Give a model"),
        (["estimate", "--model", "llama-7b", "--units", "MB"], "units: 'MB' is not allowed"),
    ],
)
def test_bad_input_exit_2(argv, needle, capsys):
    assert main(argv + ["--lang", "en"]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "Traceback" not in err


def test_spanish_message(capsys):
    assert main(["estimate", "--model", "llama-7b", "--batch", "0", "--lang", "es"]) == 2
    assert "batch debe estar entre 1" in capsys.readouterr().err


def test_malformed_and_unsupported_config(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    assert main(["estimate", "--model", str(bad), "--lang", "en"]) == 2
    assert "is not valid JSON" in capsys.readouterr().err
    bad.write_text(json.dumps({"model_type": "t5", "d_model": 768}))  # an encoder-decoder: no family reads it
    assert main(["estimate", "--model", str(bad), "--lang", "en"]) == 2
    # no family module reads it: answered from the trace, which refuses an encoder-decoder (or, without the
    # [trace] extra, the refusal says how to get the answer)
    err = capsys.readouterr().err
    assert "'t5' is not a causal language model" in err or "does not know the architecture 't5'" in err
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": -5}))
    assert main(["estimate", "--model", str(bad), "--lang", "en"]) == 2
    assert "bad value for 'hidden_size'" in capsys.readouterr().err
    bad.write_text(json.dumps([1, 2]))
    assert main(["estimate", "--model", str(bad), "--lang", "en"]) == 2
    assert "must be a JSON object" in capsys.readouterr().err


def test_local_config_json_works(tmp_path, capsys):
    from cabe.models import preset

    cfg = dict(preset("llama-3.2-1b").config)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert main(["estimate", "--model", str(p), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == 1_235_814_400


def test_hub_offline_is_a_clear_message(monkeypatch, tmp_path, capsys):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import time

    t0 = time.perf_counter()
    assert main(["estimate", "--model", "someone/some-model", "--lang", "en"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach Hugging Face" in err and "someone/some-model" in err and "Traceback" not in err
    assert time.perf_counter() - t0 < 5  # no retry loop


def test_hub_unresolvable_host_is_offline_at_once(monkeypatch, tmp_path, capsys):
    pytest.importorskip("huggingface_hub")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://no-such-host.invalid")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert main(["estimate", "--model", "someone/some-model", "--lang", "es"]) == 2
    assert "sin conexión" in capsys.readouterr().err


# The Hub's refusals (gated, missing, no config.json), timeouts and size caps are tested against a
# fake hub on 127.0.0.1: tests/web/test_hub_server.py.


def test_hub_cached_config_is_read_offline(monkeypatch, tmp_path, capsys):
    hf = pytest.importorskip("huggingface_hub")
    from cabe import models

    cfg = dict(models.preset("qwen2.5-0.5b").config)
    target = tmp_path / "config.json"
    target.write_text(json.dumps(cfg))

    def fake_download(repo_id, filename, revision=None, local_files_only=False):
        assert filename == "config.json"
        return str(target)

    monkeypatch.setattr(hf, "hf_hub_download", fake_download)
    src = models.from_hub("Qwen/Qwen2.5-0.5B")
    assert src.spec.parameter_count == 494_032_768


def test_module_runs_without_torch_import():
    code = (
        "import sys; from cabe.cli import main; main(['estimate','--model','llama-7b','--json']); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'; "
        "assert 'cabe.trace' not in sys.modules and 'starlette' not in sys.modules, 'heavy extra imported'"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_models_gpus_lora_commands(capsys):
    assert main(["models", "--lang", "en"]) == 0
    out = capsys.readouterr().out
    assert "llama-3.1-8b" in out and "8,030,261,248" in out
    assert main(["gpus", "--lang", "en"]) == 0
    assert "rtx-4090" in capsys.readouterr().out
    assert main(["lora", "--model", "llama-7b", "--rank", "8", "--targets", "q_proj,v_proj", "--lang", "en"]) == 0
    out = capsys.readouterr().out
    assert "4,194,304" in out


def test_fits_on_skips_cards_without_bf16_for_bf16_runs(capsys):
    import json as _json

    assert main(["estimate", "--model", "llama-3.2-1b", "--method", "lora", "--json"]) == 0
    fits = _json.loads(capsys.readouterr().out)["fits_on"]
    assert "t4" not in fits and "v100-16gb" not in fits and "rtx-4090" in fits
    assert main(["estimate", "--model", "llama-3.2-1b", "--method", "lora", "--precision", "fp16-amp", "--json"]) == 0
    assert "v100-32gb" in _json.loads(capsys.readouterr().out)["fits_on"]
