"""Sequence parallelism as torch's styles run it (cabe.parallel.activations.sequence_parallel): the norms' tensors
split over the sequence, the projections' all-gathered inputs whole. Golden numbers with their arithmetic."""

from __future__ import annotations

from cabe import api
from cabe.parallel.activations import sequence_parallel

KW = dict(model="llama-3.1-8b", method="full", dtype="bf16", autocast="none", batch=4, seq=4096, gpus=8, tp=8)


def test_the_gathered_inputs_stay_whole():
    """Of 100 saved bytes of which 20 are all-gathered inputs, one of 4 GPUs keeps 80 / 4 + 20."""
    assert sequence_parallel(100, 20, 4) == 40


def test_no_all_gather_buffer_beside_the_saved_inputs():
    """torch's all-gathered sequence is the input the projections save: no ``tp_comm`` buffer (Megatron's global
    all-gather buffer is not in torch's styles)."""
    r = api.build({**KW, "optimizer": "adamw", "sequence_parallel": True})
    assert "tp_comm" not in r.components


def test_sequence_parallel_saves_less_than_tp_alone_and_more_than_korthikanti():
    """llama-3.1-8b, 4 × 4,096 tokens, t = 8, bf16: per layer the q/k/v and gate/up inputs (2 × 2·h per token, 2 ×
    134,217,728 B) stay whole, so SP keeps more than sbh·34/t (everything over t) and less than TP alone."""
    sp = api.build({**KW, "optimizer": "adamw", "sequence_parallel": True})
    tp = api.build({**KW, "optimizer": "adamw"})
    one = api.build({**KW, "optimizer": "adamw", "checkpointing": True, "sequence_parallel": True})
    assert sp.components["activations"] < tp.components["activations"]
    assert one.components["activations"] < sp.components["activations"]
    gathered = 2 * 2 * 4096 * 4 * 4096  # per layer: attn.input + mlp.input, bf16
    layers = 32
    assert sp.components["activations"] > layers * gathered


def test_non_sp_unchanged():
    """TP without SP keeps Korthikanti's 10/34 replicated fraction for a layer's transients (its saved tensors go
    tensor by tensor: tests/parallel/test_tensor_parallel.py)."""
    from cabe.parallel.activations import TP_REPLICATED_ACT_FRACTION, tensor_parallel
    from cabe.training import TrainingSetup

    f = tensor_parallel(TrainingSetup(gpus=8, tp=8))
    assert f.saved == TP_REPLICATED_ACT_FRACTION + (1 - TP_REPLICATED_ACT_FRACTION) / 8 and f.checkpointed == 1.0
