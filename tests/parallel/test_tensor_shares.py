"""One pass, tensor by tensor: each parameter tensor's per-GPU share, cut as the engines cut it, turned into
bytes with the single-GPU rules; and the engines' own mixed precision (``param_dtype``)."""

from __future__ import annotations

import pytest

from cabe import api
from cabe.analytic.states import _model_states
from cabe.errors import InvalidValueError
from cabe.models import preset
from cabe.parallel.config import DEFAULT_CONFIG
from cabe.parallel.layout import Layout
from cabe.parallel.shares import flat_partition, fsdp_shard, holdings, zero3_shard
from cabe.parallel.strategy import Context
from cabe.parameters import parameter_tensors
from cabe.precision import dtypes_for, resolve
from cabe.tensors import Tensor
from cabe.training import TrainingSetup
from cabe.units import GB

LLAMA2_7B = preset("llama-2-7b").spec


def test_fsdp2_shard_is_a_padded_dim0_chunk():
    # torch 2.13 _fsdp_param.py:304: torch.chunk on dim 0, every rank padded to chunks[0]:
    # 11008 rows over 3 ranks -> ceil(11008 / 3) = 3670 rows of 4096
    t = Tensor("up_proj", 11008 * 4096, 32, True, "base", 11008, 4096)
    s = fsdp_shard(t, 3)
    assert (s.rows, s.numel) == (3670, 3670 * 4096)
    # a 1-D tensor (a norm's weight) is its own dim 0: ceil(4096 / 3) = 1366
    assert fsdp_shard(Tensor("norm", 4096, 65, True, "norm"), 3).numel == 1366


def test_zero3_partition_pads_each_parameter():
    # partition_parameters.py _padding_size: numel padded to a multiple of the world, then split
    assert zero3_shard(Tensor("norm", 10, 1, True, "norm"), 4).numel == 3  # (10 + 2) / 4


def test_zero12_partition_is_one_flat_aligned_buffer_per_dtype():
    # stage_1_and_2.py: flatten_dense_tensors_aligned(..., nccl_start_alignment_factor (2) * world)
    # 5 + 5 = 10 elements of one dtype over 4 ranks: padded to 16, 4 each; the fp32 tensor its own buffer
    items = [(Tensor("a", 5, 1, True, "base"), 1.0, 2), (Tensor("b", 5, 1, True, "base"), 1.0, 2)]
    items.append((Tensor("c", 3, 1, True, "adapter"), 1.0, 4))
    out = flat_partition(items, 4)
    assert sorted((t.numel, b) for t, _, b in out) == [(2, 4), (4, 2)]  # fp32: 3 -> 8 / 4 = 2


@pytest.mark.parametrize(
    "kw",
    [
        {"method": "full", "dtype": "fp32", "autocast": "none"},
        {"method": "full", "dtype": "bf16", "autocast": "none", "optimizer": "adafactor"},
        {"method": "lora", "dtype": "bf16", "autocast": "bf16", "lora_targets": ("all-linear",)},
        {"method": "qlora", "dtype": "bf16", "autocast": "bf16", "optimizer": "adamw-8bit"},
        {"method": "freeze", "dtype": "fp32", "autocast": "bf16", "trainable_layers": 3, "optimizer": "lion"},
    ],
)
def test_one_gpu_share_is_the_single_gpu_pass_to_the_byte(kw):
    # the multi-GPU pass and the single-GPU pass are one: with one GPU and no sharding the per-tensor sums
    # are, byte for byte, the single-GPU weights, gradients, optimizer state and step temporaries
    setup = resolve(TrainingSetup(**kw), LLAMA2_7B.dtype)
    dt = dtypes_for(setup)
    one = Layout(1, 1, 1, 1, 1, "none", 1, 0, LLAMA2_7B.num_layers)
    mine = holdings(LLAMA2_7B, setup, DEFAULT_CONFIG, parameter_tensors(LLAMA2_7B, setup), dt, one)
    c = Context(setup, DEFAULT_CONFIG, dt, one, mine)
    st = _model_states(LLAMA2_7B, setup)
    assert (c.weights, c.grads, c.optimizer, c.temporaries) == (
        st.weights + st.quant,
        st.grads,
        st.opt.state_bytes,
        st.opt.temp_bytes,
    )


def _est(**kw):
    return api.build({"model": "llama-2-70b", "batch": 1, "seq": 4096, "gpus": 8, "shard": "fsdp", **kw})


def test_fsdp_param_dtype_computes_in_bf16_over_fp32_shards():
    # MixedPrecisionPolicy(param_dtype=bf16) over fp32 weights: the activations are those of a bf16 module
    # (the same as bf16 weights under bf16 autocast), while the sharded states stay fp32
    engine = _est(dtype="fp32", autocast="bf16", param_dtype="bf16")
    bf16 = _est(dtype="bf16", autocast="bf16")
    autocast = _est(dtype="fp32", autocast="bf16")
    assert engine.components["activations"] == bf16.components["activations"]
    assert engine.components["activations"] < autocast.components["activations"]  # fp32 residual stream
    per_gpu = engine.extra["distributed"]["per_gpu"]
    # fp32 shards: about 4 B × 68.98e9 / 8 = 34.5 GB of weights, Adam 2 × that
    assert round(per_gpu["weights_bytes"] / GB, 1) == 34.5
    assert round(per_gpu["optimizer_bytes"] / GB, 1) == 69.0
    assert "fsdp_param_dtype_bf16" in engine.extra["distributed"]["notes"]


def test_deepspeed_bf16_mode_has_fp32_master_partitions():
    r = _est(shard="zero3", dtype="fp32", autocast="none", param_dtype="bf16", checkpointing=True)
    d = r.extra["distributed"]
    assert "zero_param_dtype_bf16" in d["notes"]
    # fp32 masters of the partition: 4 B × ceil(numel / 8) per parameter ≈ 4 × 68.98e9 / 8 = 34.5 GB
    assert round(d["per_gpu"]["master_weights_bytes"] / GB, 1) == 34.5


def test_param_dtype_needs_a_sharding_engine():
    with pytest.raises(InvalidValueError) as e:
        api.build({"model": "llama-2-7b", "param_dtype": "bf16"})
    assert e.value.code == "param_dtype_needs_sharding" and e.value.field == "param_dtype"
