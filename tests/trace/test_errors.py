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
