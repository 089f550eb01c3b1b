"""The trace smoke (``pytest -m smoke``): a few tiny models per family traced, LoRA and QLoRA, on whatever
transformers / PEFT / bitsandbytes are installed. CI runs it twice (issue 29): against ``constraints.txt``
(``scripts/test.sh``) and against the newest releases the package index offers (``scripts/test_newest.sh``, the second
lane of ``.ci/run``), so that a release that breaks the trace is seen the day it is installed.

Each case must trace (or, for a family whose patched private name the installed release lacks, be refused with the
typed ``trace_unsupported_transformers`` error, never an AttributeError), and the traced peak must lie within 10% of
cabe's estimate: wide enough for the release-to-release drift the estimate does not follow (transformers 5.25's Falcon
eager attention: -6.8%, benchmarks/ecosystem/results.md), narrow enough to catch a trace that ran something else.
About 40 s on 2 cores."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from conftest import fake_trace
from test_compat import FALCON

from cabe import families
from cabe.analytic import estimate_model
from cabe.errors import UnsupportedVersionError
from cabe.trace import compat
from cabe.training import TrainingSetup
from configs import DEEPSEEK_V3, GRANITE_HYBRID, TINY

pytestmark = [pytest.mark.trace, pytest.mark.smoke]

LORA = dict(method="lora", precision="bf16", batch=1, seq=64)
QLORA = dict(method="qlora", batch=1, seq=64)
CASES = {
    "llama-lora": (TINY["llama"], LORA),
    "llama-qlora": (TINY["llama"], QLORA),
    "llama-lora-flash-ckpt": (TINY["llama"], dict(LORA, attention="flash", checkpointing=True)),
    "qwen2-lora": (TINY["qwen2"], LORA),
    "mistral-lora": (TINY["mistral"], LORA),
    "gemma2-lora": (TINY["gemma2"], LORA),
    "phi3-lora": (TINY["phi3"], LORA),
    "gpt2-lora": (TINY["gpt2"], LORA),
    "gpt_neox-full": (TINY["gpt_neox"], dict(method="full", precision="bf16", batch=1, seq=64)),
    "falcon-lora": (FALCON, LORA),
    "falcon-lora-flash": (FALCON, dict(LORA, attention="flash")),
    "mixtral-lora": (TINY["mixtral"], LORA),
    "mixtral-qlora": (TINY["mixtral"], QLORA),
    "qwen3_moe-lora": (TINY["qwen3_moe"], LORA),
    "qwen2_moe-lora": (TINY["qwen2_moe"], LORA),
    "deepseek_v3-lora": (
        DEEPSEEK_V3,
        dict(LORA, lora_targets=("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj")),
    ),
    "granitemoehybrid-lora": (GRANITE_HYBRID, LORA),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tiny_model_traces(case):
    config, kw = CASES[case]
    setup = TrainingSetup(**kw)
    try:
        traced = fake_trace(config, setup)
    except UnsupportedVersionError as e:  # a family this release cannot trace: refused by name, in one sentence
        assert e.code == "trace_unsupported_transformers", e.code
        pytest.skip(f"{case}: refused on transformers {compat.transformers_version()}: {e.params['symbol']}")
    assert traced.peak_bytes > 0 and traced.trainable_parameters > 0
    est = estimate_model(families.from_config(config), setup).total_bytes
    assert abs(est - traced.peak_bytes) / traced.peak_bytes < 0.10, (case, est, traced.peak_bytes)


def test_installed_releases_are_inside_the_window():
    """The lane prints them; here they must lie in the window the trace accepts."""
    for package in compat.WINDOW:
        version = compat.installed(package)
        if version is not None:
            print(package, version)
            assert compat.in_window(package, version), (package, version, compat.window_text(package))
