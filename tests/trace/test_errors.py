"""Bad input raises typed cabe errors, never a traceback."""

import builtins

import pytest

from cabe.errors import CabeError, ConfigError, MissingDependencyError
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace


def test_missing_torch_is_a_missing_dependency_error(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    from cabe.trace import trace_step

    with pytest.raises(MissingDependencyError) as e:
        trace_step({"model_type": "llama"}, TrainingSetup())
    assert e.value.code == "missing_extra" and e.value.params["package"] == "torch"
    assert e.value.params["extra"] == "trace"


@pytest.mark.parametrize(
    "config,code",
    [
        ({"model_type": "nonexistent", "hidden_size": 64}, "unknown_architecture"),
        ({"hidden_size": 64}, "missing_model_type"),
        (
            {
                "model_type": "vit",
                "hidden_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "intermediate_size": 64,
            },
            "not_causal_lm",
        ),
        ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": "many"}, "bad_config"),
    ],
)
def test_bad_configs(config, code):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from cabe.trace import trace_step

    with pytest.raises(ConfigError) as e:
        trace_step(config, TrainingSetup(batch=1, seq=8))
    assert e.value.code == code


def test_not_a_dict_and_not_a_setup():
    pytest.importorskip("torch")
    from cabe.trace import trace_step

    with pytest.raises(ConfigError):
        trace_step(["llama"], TrainingSetup())  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        trace_step({"model_type": "llama"}, {"method": "full"})  # type: ignore[arg-type]


def test_measure_without_cuda_says_no_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    from cabe.trace.measure import measure_step

    with pytest.raises(CabeError) as e:
        measure_step({"model_type": "llama"}, TrainingSetup())
    assert e.value.code == "no_cuda"


def _all_params_are_codes_or_numbers(err: CabeError) -> None:
    """Only codes (no spaces), numbers and a library's own message (``detail``) travel in an error."""
    for k, v in err.params.items():
        if k in ("detail", "reason"):  # the OS's / library's own text, shown as data
            continue
        assert not isinstance(v, str) or " " not in v, (k, v)


@pytest.mark.parametrize("code", ["disabled", "torch_imported", "no_torch", "no_compiler", "compile_failed"])
def test_no_fake_cuda_is_a_code_with_words_in_both_catalogs(monkeypatch, code):
    pytest.importorskip("torch")
    from cabe.i18n import error_message
    from cabe.trace import _native, engine

    monkeypatch.setenv("CABE_NO_SUBPROCESS", "1")
    monkeypatch.setattr(_native, "_lib", None)
    monkeypatch.setattr(_native, "_reason", code)
    monkeypatch.setattr(_native, "_detail", "g++: error 1" if code == "compile_failed" else "")
    monkeypatch.setattr(_native, "torch_has_cuda", lambda: False)
    monkeypatch.setattr(__import__("torch").cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as e:
        engine.resolve_mode("fake", TrainingSetup())
    err = e.value
    assert err.code == "mode_unsupported" and err.params["why"] == code
    _all_params_are_codes_or_numbers(err)
    en, es = error_message(err, "en"), error_message(err, "es")
    assert "no fake CUDA device" in en and "no hay dispositivo CUDA simulado" in es
    if code == "compile_failed":
        assert "g++: error 1" in en and "g++: error 1" in es


def test_subprocess_is_chosen_on_the_code_not_on_words(monkeypatch):
    pytest.importorskip("torch")
    from cabe.trace import _native, engine

    monkeypatch.delenv("CABE_NO_SUBPROCESS", raising=False)
    monkeypatch.setattr(_native, "_lib", None)
    monkeypatch.setattr(_native, "_reason", "torch_imported")
    monkeypatch.setattr(_native, "torch_has_cuda", lambda: False)
    monkeypatch.setattr(__import__("torch").cuda, "is_available", lambda: False)
    assert engine.resolve_mode("auto", TrainingSetup()) == "fake-subprocess"
    monkeypatch.setattr(_native, "_reason", "disabled")
    assert engine.resolve_mode("auto", TrainingSetup(precision="fp32", optimizer_impl="foreach")) == "meta"


def test_mode_errors_carry_why_codes():
    pytest.importorskip("torch")
    from cabe.i18n import error_message
    from cabe.trace.engine import resolve_mode

    with pytest.raises(ConfigError) as e:
        resolve_mode("meta", TrainingSetup(precision="bf16-amp"))
    assert (e.value.code, e.value.params["why"]) == ("mode_unsupported", "needs_fake")
    assert "fake CUDA device" in error_message(e.value, "en")
    with pytest.raises(ConfigError) as e:
        resolve_mode("cpu", TrainingSetup(precision="bf16-amp"))
    assert e.value.params["why"] == "cpu_autocast"
    assert "autocast de CUDA" in error_message(e.value, "es")


def test_trace_failed_keeps_its_code_and_says_why():
    from cabe.i18n import error_message

    err = ConfigError("trace_failed", None, why="worker_exited")
    assert err.code == "trace_failed"
    assert error_message(err, "en").endswith("the trace worker process exited.")
    assert "proceso trabajador" in error_message(err, "es")
    err = ConfigError("trace_failed", None, why="exception", detail="RuntimeError: boom")
    assert "RuntimeError: boom" in error_message(err, "en") and "RuntimeError: boom" in error_message(err, "es")


def test_a_trace_over_the_worker_time_limit_is_stopped_and_the_next_one_runs(monkeypatch):
    """The server's one trace worker: a request over CABE_TRACE_TIME_LIMIT is stopped (a typed error in both
    languages, the worker killed), and the next request gets a fresh worker. The limit here, 0.05 s, is shorter
    than the worker's start (it imports torch), so the first request is over it for sure."""
    pytest.importorskip("torch")
    from cabe.i18n import error_message
    from cabe.trace import worker

    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1}
    config |= {"num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 128}
    setup = TrainingSetup(method="full", precision="bf16", batch=1, seq=16)
    client = worker._Worker()
    monkeypatch.setattr(worker, "_WORKER", client)
    monkeypatch.setenv(worker.TIME_LIMIT_ENV, "0.05")
    with pytest.raises(ConfigError) as e:
        worker.request("trace", config, setup, steps=2)
    assert (e.value.code, e.value.params["why"], e.value.params["seconds"]) == ("trace_failed", "time_limit", "0.05")
    assert "CABE_TRACE_TIME_LIMIT" in error_message(e.value, "en") and "límite" in error_message(e.value, "es")
    assert client.proc is None  # killed
    monkeypatch.delenv(worker.TIME_LIMIT_ENV)
    out = worker.request("trace", config, setup, steps=2)
    assert out["peak_bytes"] > 0 and client.proc.poll() is None
    client.proc.kill()
