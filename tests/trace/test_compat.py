"""The supported window and the guarded patches (issue 29): a private name of one family missing from the installed
transformers refuses that family in one sentence and leaves every other family traceable; a release outside the
window is refused before anything is imported."""

import sys
from pathlib import Path

import pytest
import tomllib

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from cabe.errors import UnsupportedVersionError
from cabe.i18n import error_message
from cabe.trace import compat
from cabe.trace.engine import run_trace
from cabe.trace.family_patches import FAMILIES, model_types
from cabe.training import TrainingSetup
from configs import TINY

pytestmark = [pytest.mark.trace, pytest.mark.smoke]

ROOT = Path(__file__).resolve().parents[2]

#: a tiny multi-query Falcon (falcon-7b's layout: one key / value head, parallel attention)
FALCON = dict(
    model_type="falcon",
    hidden_size=128,
    num_attention_heads=4,
    num_hidden_layers=2,
    vocab_size=512,
    multi_query=True,
    new_decoder_architecture=False,
    parallel_attn=True,
    alibi=False,
    bias=False,
)
SETUP = TrainingSetup(method="lora", precision="bf16", batch=1, seq=32)


def _trace(config):
    """A trace in this process (so that the monkeypatches are seen): fake CUDA when the shim is loaded, else meta
    (transformers 5 only: 4.57's rotary embeddings cannot run on meta)."""
    from cabe.trace import _native

    if _native.available():
        return run_trace(config, SETUP, 2, "fake")
    if not compat.transformers_at_least("5"):
        pytest.skip("no fake CUDA in this process and transformers 4 cannot trace on meta")
    return run_trace(config, SETUP, 2, "meta")


def test_window_is_the_trace_extra_of_pyproject():
    """pyproject's [trace] extra declares exactly compat.WINDOW, and the releases tested lie inside it."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["trace"]
    declared = {r.split(">=")[0]: r for r in extra if ">=" in r}
    for package in compat.WINDOW:
        assert declared[package] == compat.window_text(package), (package, declared.get(package))
        for version in compat.TESTED[package]:
            assert compat.in_window(package, version), (package, version)


def test_constraints_pin_a_tested_release_inside_the_window():
    pins = dict(line.split("==", 1) for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line)
    for package in compat.WINDOW:
        version = pins[package].split("+")[0]
        assert version in compat.TESTED[package], (package, version)


def test_release_parses_local_and_dev_versions():
    assert compat.release("2.13.0+cpu") == (2, 13, 0)
    assert compat.release("5.26.0.dev0") == (5, 26, 0)
    assert compat.release("1.0rc1") == (1, 0)
    assert compat.in_window("transformers", "4.57.6") and compat.in_window("transformers", "5.25.0")
    assert not compat.in_window("transformers", "4.56.2") and not compat.in_window("transformers", "6.0.0")


def test_a_transformers_outside_the_window_is_refused_in_one_sentence(monkeypatch):
    real = compat.installed
    monkeypatch.setattr(compat, "installed", lambda p: "4.46.3" if p == "transformers" else real(p))
    from cabe.trace.engine import trace_step

    with pytest.raises(UnsupportedVersionError) as e:
        trace_step(TINY["llama"], SETUP)
    assert e.value.code == "trace_unsupported_version"
    assert e.value.params["version"] == "4.46.3" and e.value.params["works"] == compat.TESTED["transformers"][0]
    for lang in ("en", "es"):
        msg = error_message(e.value, lang)
        assert "4.46.3" in msg and compat.window_text("transformers") in msg and "\n" not in msg


def _falcon_patch_symbol_removed(monkeypatch):
    """Remove the private name the Falcon patch needs on this transformers: ``FalconAttention._split_heads`` where it
    exists (up to 5.24); on 5.25, which has no such name, the release is reported as 5.24.0 so that the patch
    looks for it."""
    from transformers.models.falcon import modeling_falcon as mf

    if hasattr(mf.FalconAttention, "_split_heads"):
        monkeypatch.delattr(mf.FalconAttention, "_split_heads")
    else:
        real = compat.installed
        monkeypatch.setattr(compat, "installed", lambda p: "5.24.0" if p == "transformers" else real(p))


def test_a_missing_private_name_refuses_that_family_only(monkeypatch):
    """The bug of issue 29: Falcon's ``_split_heads`` gone, every family failed with an AttributeError."""
    _falcon_patch_symbol_removed(monkeypatch)
    with pytest.raises(UnsupportedVersionError) as e:
        _trace(FALCON)
    err = e.value
    assert err.code == "trace_unsupported_transformers" and err.params["family"] == "falcon"
    assert err.params["symbol"].endswith("FalconAttention._split_heads")
    assert err.params["version"] == compat.transformers_version()
    for lang in ("en", "es"):
        msg = error_message(err, lang)
        assert "falcon" in msg and "_split_heads" in msg and err.params["version"] in msg
    # the same process, the same transformers: Llama (and another family with patches of its own) still trace
    for family in ("llama", "qwen2", "gpt2"):
        assert _trace(TINY[family]).peak_bytes > 0
    # and the refusal left nothing patched behind
    from transformers.models.falcon import modeling_falcon as mf

    assert "cabe_fa2" not in getattr(mf, "FALCON_ATTENTION_CLASSES", {})


def test_a_general_patch_that_cannot_apply_refuses_in_one_sentence(monkeypatch):
    import transformers.masking_utils as mu

    monkeypatch.delattr(mu, "find_packed_sequence_indices")
    with pytest.raises(UnsupportedVersionError) as e:
        _trace(TINY["llama"])
    assert e.value.code == "trace_unsupported_transformers" and e.value.params["why"] == "general"
    assert "every trace" in error_message(e.value, "en")


def _environment(types):
    """The trace's patches alone, as a meta trace enters them."""
    import contextlib

    import torch

    from cabe.trace import patches, state

    stack = contextlib.ExitStack()
    stack.enter_context(state.active(state.AttentionState(torch.device("meta"))))
    stack.enter_context(patches.trace_environment("meta", SETUP, types))
    return stack


def test_gated_deltanet_patch_is_guarded_for_its_family(monkeypatch):
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    monkeypatch.delattr(m, "torch_chunk_gated_delta_rule")
    with pytest.raises(UnsupportedVersionError) as e, _environment(("qwen3_next",)):
        pass
    assert e.value.params["family"] == "qwen3_next"
    with _environment(("llama",)):
        pass


def test_patches_of_a_family_are_applied_only_when_it_is_traced():
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    own = m.torch_chunk_gated_delta_rule
    with _environment(("llama",)):
        assert m.torch_chunk_gated_delta_rule is own
    with _environment(("qwen3_next",)):
        assert m.torch_chunk_gated_delta_rule is not own
    assert m.torch_chunk_gated_delta_rule is own


def test_model_types_reads_sub_configs():
    assert model_types({"model_type": "qwen3_vl", "text_config": {"model_type": "qwen3_vl_text"}}) == ("qwen3_vl",)
    assert model_types(FALCON) == ("falcon",)
    assert set(FAMILIES) >= {"falcon", "granitemoehybrid", "qwen3_next"}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
