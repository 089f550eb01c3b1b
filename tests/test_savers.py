"""Selective checkpointing and activation offloading in the analytic estimate: which layers keep what,
the host RAM offloading needs, the typed errors, and the readers that set them."""

import pytest

from cabe import configs, models
from cabe.analytic import estimate_model
from cabe.errors import CabeError
from cabe.training import TrainingSetup

LLAMA = models.preset("llama-3.2-1b").spec  # 16 layers, hidden 2048, bf16


def _est(**kw):
    return estimate_model(LLAMA, TrainingSetup(method="lora", batch=2, seq=1024, **kw))


def test_every_one_is_plain_checkpointing():
    assert _est(checkpointing=True, checkpoint_every=1).total_bytes == _est(checkpointing=True).total_bytes


def test_selective_sits_between_none_and_all():
    none = _est().total_bytes
    every = [_est(checkpointing=True, checkpoint_every=k).total_bytes for k in (1, 2, 4, 16)]
    assert every == sorted(every) and every[-1] < none


def test_selective_steps_count_the_layers():
    """k = 3 over 16 layers: transformers checkpoints layers 0, 3, 6, 9, 12, 15 (modeling_utils.py:3246)."""
    steps = {s.key: s for s in _est(checkpointing=True, checkpoint_every=3).steps}
    ckpt = steps["activations.checkpointed"]
    assert ckpt.params["layers"] == 6
    assert ckpt.bytes == 6 * 2048 * 2 * 2048  # 6 inputs × 2,048 tokens × 2 B × h
    assert steps["activations.selective"].params["layers"] == 10


def test_offload_host_ram():
    """Every layer checkpointed and offloaded: 16 inputs of 2,048 tokens × 2 B × 2,048 on the host, pinned."""
    r = _est(checkpointing=True, offload_activations=True)
    host = r.extra["host"]
    assert host["offloaded_activations_bytes"] == host["pinned_bytes"] == 16 * 2048 * 2 * 2048
    assert "activations_offloaded" in r.notes
    # on the device: no layer input through the forward but the frozen embeddings' output (one input)
    assert r.total_bytes < _est(checkpointing=True).total_bytes
    assert "host" not in _est(checkpointing=True).extra


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        (dict(checkpoint_every=2), "savers_need_checkpointing"),
        (dict(offload_activations=True), "savers_need_checkpointing"),
        (dict(checkpointing=True, checkpoint_every=2, gpus=2, shard="fsdp"), "savers_one_gpu"),
        (dict(checkpointing=True, checkpoint_every=0), "out_of_range"),
    ],
)
def test_savers_errors(kw, code):
    with pytest.raises(CabeError) as e:
        TrainingSetup(method="lora", **kw)
    assert e.value.code == code


def test_readers_set_the_savers():
    tt, _, _ = configs.module("torchtune").to_request(
        {
            "model": {"_component_": "torchtune.models.llama3_2.lora_llama3_2_1b"},
            "enable_activation_checkpointing": True,
            "enable_activation_offloading": True,
            "ac_mode": "selective",
            "ac_option": 2,
        }
    )
    assert (tt["checkpointing"], tt["offload_activations"], tt["checkpoint_every"]) == (True, True, 2)
    ax, _, _ = configs.module("axolotl").to_request(
        {
            "base_model": "x/y",
            "gradient_checkpointing": "offload",
            "gradient_checkpointing_kwargs": {"every_n_layers": 3},
        }
    )
    assert (ax["checkpointing"], ax["offload_activations"], ax["checkpoint_every"]) == (True, True, 3)
    ta, _, _ = configs.module("training_args").to_request(
        {"gradient_checkpointing": True, "activation_checkpointing_kwargs": '{"every_n_layers": 4, "offload": true}'}
    )
    assert (ta["checkpoint_every"], ta["offload_activations"]) == (4, True)


def _pk(**kw):
    return estimate_model(LLAMA, TrainingSetup(method="lora", batch=8, seq=2048, **kw))


def test_packed_rows_under_flash_cost_what_padded_rows_do():
    """flash-attn runs packed documents through its varlen path: no mask, the same memory per token."""
    assert _pk(attention="flash", packing="packed").total_bytes == _pk(attention="flash").total_bytes


def test_padding_free_is_one_row():
    """padding-free: one row of 8 × 2,048 = 16,384 tokens. Under flash only the rotary tables grow: cos and
    sin over 16,384 positions instead of 2,048, 2 × 64 × 2 B each (head dim 64, bf16)."""
    r = _pk(attention="flash", packing="padding-free")
    assert r.total_bytes - _pk(attention="flash").total_bytes == 2 * (16384 - 2048) * 64 * 2
    step = next(s for s in r.steps if s.key == "setup.packing")
    assert (step.params["rows"], step.params["row"]) == (1, 16384)
    assert r.setup["batch"] == 8 and "packing_modelled" in r.notes  # the report keeps the request


def test_packing_under_sdpa_masks_every_layer():
    """SDPA gets a block-diagonal mask (no is_causal): the memory-efficient kernel, which costs more than
    flash; over the whole row when padding-free."""
    padded, packed, free = (_pk(packing=p).total_bytes for p in ("none", "packed", "padding-free"))
    assert padded < packed < free


def test_readers_set_packing():
    ta, _, _ = configs.module("training_args").to_request({"packing": True, "packing_strategy": "wrapped"})
    assert ta["packing"] == "packed"
    ta, _, _ = configs.module("training_args").to_request({"packing": True})  # TRL's bfd: padding-free
    assert ta["packing"] == "padding-free"
    ta, _, _ = configs.module("training_args").to_request({"packing": True, "padding_free": True})
    assert ta["packing"] == "padding-free"
    ax, _, _ = configs.module("axolotl").to_request({"base_model": "x/y", "sample_packing": True})
    assert ax["packing"] == "packed"
