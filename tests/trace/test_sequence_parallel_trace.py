"""Sequence parallelism with tensor parallelism: torch's own styles (torchtitan's ``parallelize_llama``) on
transformers' Llama-family models, rank 0 on PyTorch's fake process group, against the per-GPU estimate."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe import api
from cabe.errors import InvalidValueError
from cabe.training import TrainingSetup
from cabe.units import CUDA_WORKSPACES
from configs import TINY

pytestmark = pytest.mark.trace

#: 4 layers of hidden 256, ffn 688, vocab 2048 (as tests/trace/test_distributed.py)
CONFIG = dict(TINY["llama"], hidden_size=256, intermediate_size=688, num_hidden_layers=4, vocab_size=2048)
SP_KW = dict(
    batch=2,
    seq=128,
    attention="eager",
    dtype="bf16",
    autocast="none",
    gpus=2,
    tp=2,
    optimizer_impl="for-loop",
    sequence_parallel=True,
)


def _sp_error(kw, config=CONFIG):
    from cabe.trace.distributed import trace

    traced = trace(config, TrainingSetup(**kw), 2, "cpu")
    est = api.build({"config": config, **kw})
    assert traced.components["optimizer"] == est.components["optimizer"]
    assert 0 <= traced.components["weights"] - est.components["weights"] <= 1024  # (the rotary buffer's block)
    return traced, est, (est.total_bytes - CUDA_WORKSPACES - traced.peak_bytes) / traced.peak_bytes


@pytest.mark.parametrize(
    "extra",
    [
        # measured on real CPU tensors: TP alone −0.069% (loss_parallel), −0.022% (gathered logits); under FSDP2 on a
        # (2, 2) mesh −0.086% and −0.029%; the activations equal the trace's to the byte at the head's backward
        {},
        {"loss_parallel": False},
        {"gpus": 4, "shard": "fsdp"},
        {"gpus": 4, "shard": "fsdp", "loss_parallel": False},
        # checkpointing, gathered logits: −0.97% (the peak is a layer's backward)
        {"checkpointing": True, "loss_parallel": False},
    ],
)
def test_sequence_parallel_rank0(extra):
    traced, est, error = _sp_error(dict(SP_KW, **extra))
    assert traced.engine["sequence_parallel"] is True and traced.engine["tp"] == 2
    assert traced.engine["loss_parallel"] is extra.get("loss_parallel", True)
    assert "tp_comm" not in est.components  # torch's all-gathered sequence is the projections' saved input
    assert abs(error) < 0.012, error


def test_sequence_parallel_saves_the_gathered_inputs_whole():
    """Without checkpointing the activations at the head's backward are the estimate's to the byte. One layer on
    one GPU saves 3,770,368 B (256 tokens), of which q/k/v's and gate/up's shared inputs are 2 × 131,072 B: they are
    PrepareModuleInput's all-gathered sequence, saved whole by the column-parallel matmuls, and the rest is split
    over t = 2 (the norms by the sequence, attention and the MLP by heads and features): (3,770,368 − 262,144) / 2 +
    262,144 = 2,016,256 B. The final norm's 525,312 B: its 131,072 B output is the lm_head's all-gathered input,
    whole; (525,312 − 131,072) / 2 + 131,072 = 328,192 B. And the rotary tables, 32,768 B."""
    traced, est, _ = _sp_error(SP_KW)
    assert traced.components["activations"] == est.components["activations"] == 4 * 2_016_256 + 328_192 + 32_768


def test_attention_sees_the_whole_sequence():
    """After PrepareModuleInput the projections see all s positions, the rotary tables and the eager mask are the
    whole sequence's (cabe.trace.sequence_parallel._whole_sequence), and the residual stream is s/t long."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import LlamaConfig, LlamaForCausalLM

    from cabe.trace import sequence_parallel

    cfg = LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg)
    seen: dict[str, tuple[int, ...]] = {}
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        sequence_parallel.apply(model, mesh["tp"], TrainingSetup(**dict(SP_KW, loss_parallel=False)))
        layer = model.model.layers[0]
        layer.self_attn.q_proj.register_forward_hook(lambda m, a, o: seen.update(q=tuple(o.shape)))
        layer.register_forward_pre_hook(
            lambda m, a, k: seen.update(
                residual=tuple(a[0].shape),
                mask=tuple(k["attention_mask"].shape),
                cos=tuple(k["position_embeddings"][0].shape),
            ),
            with_kwargs=True,
        )
        ids = torch.randint(0, 2048, (2, 128))
        model(input_ids=ids, use_cache=False)
    finally:
        dist.destroy_process_group()
    assert seen["q"] == (2, 128, 128)  # the whole sequence, half the heads
    assert seen["residual"] == (2, 64, 256)  # the sequence's half
    assert seen["mask"][-2:] == (128, 128) and seen["cos"][-2] == 128


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_llama_family(family):
    """qwen2 (q/k/v biases, 2 key / value heads) and mistral (8 heads, 2 key / value heads): the same styles.
    Measured (TINY's configs, 2 layers, batch 2 × 256, TP alone, loss_parallel): qwen2 −0.31%, mistral +0.66%, the
    activations equal to the byte (at 64 tokens the 512-byte blocks of the split norms' statistics weigh ~1%)."""
    config = dict(TINY[family], num_hidden_layers=2)
    traced, est, error = _sp_error(dict(SP_KW, batch=2, seq=256), config)
    assert traced.components["activations"] == est.components["activations"]
    assert abs(error) < 0.01, error


def test_not_llama_shaped_is_refused():
    """A decoder layer with other norms (Gemma 2's four) is not cut by these styles: refused by name."""
    from cabe.trace.distributed import trace

    with pytest.raises(InvalidValueError) as e:
        trace(dict(TINY["gemma2"], num_hidden_layers=2), TrainingSetup(**dict(SP_KW, batch=1, seq=64)), 2, "cpu")
    assert e.value.field == "sequence_parallel" and e.value.params["why"] == "sp_layer"
    en, es = e.value.to_dict("en")["message"], e.value.to_dict("es")["message"]
    assert en != es and "{" not in en + es and "gemma2" in en
