"""FSDP2's options traced on rank 0 (cabe.trace.distributed): ``reshard_after_forward=False`` and
``CPUOffloadPolicy`` (host memory counted apart), against the per-GPU estimate (tests/parallel/test_fsdp_options.py
has the arithmetic)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe import api
from cabe.errors import InvalidValueError
from cabe.trace import trace_step
from cabe.trace.distributed import refusal, trace_fsdp2
from cabe.training import TrainingSetup
from cabe.units import CUDA_WORKSPACES
from configs import TINY

pytestmark = pytest.mark.trace

#: tests/trace/test_distributed.py's: 4 layers of hidden 256, ffn 688, vocab 2048; one bf16 unit gathered 1,582,080 B
CONFIG = dict(TINY["llama"], hidden_size=256, intermediate_size=688, num_hidden_layers=4, vocab_size=2048)
KW = dict(batch=2, seq=128, attention="eager", dtype="fp32", autocast="none", gpus=4, shard="fsdp", param_dtype="bf16")
UNIT = 1_582_080


def _both(**kw):
    setup = TrainingSetup(**{**KW, **kw})
    return trace_step(CONFIG, setup), api.build({"config": CONFIG, **KW, **kw})


def test_kept_units_traced_and_estimated():
    """reshard_after_forward=False: every layer unit keeps its gather to its backward. Traced 2026-12-08: the peak
    moves to the end of forward (the logits beside all 4 units), 110,656,000 B against the estimate's 110,111,744 B
    (-0.49%); the resharded run 105,391,616 B against 105,385,472 B."""
    kept, est = _both(reshard_after_forward=False)
    resharded, _ = _both()
    assert kept.engine["reshard_after_forward"] is False and resharded.engine["reshard_after_forward"] is True
    assert kept.peak_bytes - resharded.peak_bytes > 3 * UNIT  # the 3 units more at least
    assert abs(est.total_bytes - kept.peak_bytes) / kept.peak_bytes < 0.01


def test_kept_units_on_the_fake_device_are_the_cpu_reference_plus_cublas():
    setup = TrainingSetup(**KW, reshard_after_forward=False)
    fake, cpu = trace_step(CONFIG, setup), trace_fsdp2(CONFIG, setup)
    assert abs(fake.peak_bytes - CUDA_WORKSPACES - cpu.peak_bytes) <= 1024


def test_cpu_offload_counts_the_host_apart():
    """CPUOffloadPolicy: the GPU holds the gathered units, activations and logits; the host the fp32 shards, their
    gradients, AdamW's moments and its foreach step's temporaries. Traced 2026-12-08: GPU 92,725,760 B against
    92,719,616 B (-0.01%), host 21,065,116 B against 21,076,480 B (+0.05%: the estimate rounds each tensor to
    512 B; the host's bytes are exact)."""
    traced, est = _both(offload="both")
    assert traced.engine["offload_policy"] == "CPUOffloadPolicy(pin_memory=True)"
    assert traced.components["optimizer"] == 0 and traced.components["weights"] <= 1024  # (the rotary buffer)
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 0.005
    host = est.extra["distributed"]["per_gpu"]["host_bytes"]
    assert abs(host - traced.host_bytes) / traced.host_bytes < 0.005
    assert trace_step(CONFIG, TrainingSetup(**KW)).host_bytes == 0  # nothing offloaded, no host figure


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"offload": "optimizer"}, "offload_optimizer_fsdp"),
        ({"offload": "both", "shard": "ddp"}, "offload"),
        ({"offload": "both", "shard": "zero3"}, "offload"),
    ],
)
def test_offloads_not_traced_are_refused_by_name(change, why):
    from cabe.trace import zero

    if change.get("shard") == "zero3" and not zero.available():
        why = "deepspeed"  # (refused before: DeepSpeed is not installed)
    with pytest.raises(InvalidValueError) as err:
        refusal(TrainingSetup(**{**KW, **change}))
    assert err.value.params["why"] == why
    assert "{" not in err.value.to_dict("en")["message"] + err.value.to_dict("es")["message"]


def test_cpu_offload_is_refused_on_real_cpu_tensors():
    with pytest.raises(InvalidValueError) as err:
        trace_fsdp2(CONFIG, TrainingSetup(**KW, offload="both"))
    assert err.value.params["why"] == "offload_cpu_run"


def test_cli_prints_the_host_beside_the_estimate(tmp_path):
    import json
    import subprocess
    import sys

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(CONFIG))
    cmd = [sys.executable, "-m", "cabe", "trace", "--model", str(cfg), "--batch", "2", "--seq", "128"]
    cmd += ["--gpus", "4", "--shard", "fsdp", "--offload", "both", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout)
    assert d["host_bytes"] > 0 and abs(d["estimate_host_bytes"] - d["host_bytes"]) / d["host_bytes"] < 0.005
    assert d["estimate_host_ram_bytes_per_node"] == 4 * d["estimate_host_bytes"]
