"""FSDP's options in the plan (cabe.parallel.fsdp): ``reshard_after_forward`` and CPU offload, golden figures with
their arithmetic; the field is FSDP-only; the config readers set it."""

from __future__ import annotations

import pytest

from cabe import api, configs
from cabe.errors import InvalidValueError
from cabe.models import preset
from cabe.training import TrainingSetup

#: the tiny Llama of tests/trace/test_distributed.py: 4 layers of hidden 256, ffn 688, vocab 2048 (8.4e6 parameters,
#: one layer unit 790,528 of them), rank 0 of 4 GPUs
CONFIG = dict(
    model_type="llama",
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=2048,
    max_position_embeddings=256,
)
#: (the per-layer + root cut, whose root these figures count; accelerate's own cut: test_accelerate_cut_units)
KW = dict(
    batch=2, seq=128, attention="eager", dtype="fp32", autocast="none", gpus=4, shard="fsdp", param_dtype="bf16"
) | dict(fsdp_wrap="layers")
#: one layer unit all-gathered in bf16: its nine tensors whole, each rounded to 512 B (790,528 × 2 B = 1,581,056 B)
UNIT = 1_582_080
#: the root unit (embedding, final norm, lm_head) gathered in bf16
ROOT = 2_097_664


def _est(**kw):
    return api.build({"config": CONFIG, **KW, **kw})


def test_kept_units_are_every_layer_at_the_peak():
    resharded, kept = _est(), _est(reshard_after_forward=False)
    assert resharded.components["gathered_params"] == ROOT + UNIT  # the root + the unit running (backward's start)
    assert kept.components["gathered_params"] == ROOT
    assert kept.components["kept_gathered_params"] == 4 * UNIT  # 6,328,320 B: every layer, its backward still ahead
    # the rest of the peak is the same: 3 more units, 4,746,240 B
    assert kept.total_bytes - resharded.total_bytes == 3 * UNIT
    figures = kept.extra["distributed"]["per_gpu"]
    assert figures["gathered_params_bytes"] == ROOT + 4 * UNIT


def test_kept_units_fall_as_backward_goes_down():
    """The walk (cabe.step.timeline): all 4 units held at the end of forward and at the head's backward; at a layer's
    backward it and those below it (the top layer: 4, the bottom one: 1); none at the optimizer step."""
    from cabe.step import StepParts, timeline

    names = ["weights", "optimizer", "grads", "grads_head", "grads_per_layer", "copies_layer", "copies_head"]
    names += ["saved_layer", "recompute_layer", "workspace_layer", "rotary", "head_saved", "final_norm_saved"]
    names += ["head_forward_extra", "head_backward_extra", "optimizer_temporaries"]
    zero = dict.fromkeys(names, 0)
    parts = StepParts(**zero, grad_layers=4, grads_in_forward=False, extra_pending_layer={"kept": 10})
    held = {(m.phase, m.where): m.components.get("kept", 0) for m in timeline(parts)}
    assert held[("forward", "loss")] == held[("backward", "head")] == 40
    assert held[("backward", "top_layer")] == 40 and held[("backward", "bottom_layer")] == 10
    assert held[("optimizer", "step")] == 0


def test_frozen_units_stay_gathered_to_the_end_of_backward():
    """freeze trains the top 2 layers: the 2 frozen units have no backward (FSDP2's root callback reshards them), so
    they are held beside the trained ones at every moment of backward."""
    kw = dict(method="freeze", trainable_layers=2)
    kept = _est(reshard_after_forward=False, **kw)
    assert kept.components["kept_gathered_params"] == 4 * UNIT
    assert kept.extra["distributed"]["per_gpu"]["gathered_params_bytes"] == ROOT + 4 * UNIT


def test_cpu_offload_moves_the_states_and_the_step_to_the_host():
    on_gpu, offloaded = _est(), _est(offload="both")
    g = on_gpu.extra["distributed"]["per_gpu"]
    host = offloaded.extra["distributed"]["per_gpu"]["host_bytes"]
    # the fp32 shard (4,215,296 B: each padded dim-0 chunk rounded to 512 B), its gradient, AdamW's two moments (the
    # foreach step keeps its counters on the host) and the foreach step's temporaries, one more shard-sized list
    assert (g["weights_bytes"], g["gradients_bytes"], g["optimizer_bytes"]) == (4_215_296, 4_215_296, 8_430_592)
    assert host == 4_215_296 + 4_215_296 + 8_430_592 + 4_215_296 == 21_076_480
    assert offloaded.extra["distributed"]["host_ram_bytes_per_node"] == 4 * host
    assert offloaded.components["weights"] == offloaded.components["optimizer"] == 0
    assert on_gpu.total_bytes - offloaded.total_bytes == 4_215_296 + 8_430_592  # the peak (backward) held them


def test_the_field_is_fsdp_only():
    with pytest.raises(InvalidValueError) as e:
        api.setup_from({"gpus": 8, "shard": "zero3", "reshard_after_forward": False})
    assert (e.value.code, e.value.field) == ("fsdp_only", "reshard_after_forward")
    assert "FSDP only" in e.value.to_dict("en")["message"]
    assert not api.setup_from({"gpus": 8, "shard": "fsdp-hybrid", "reshard_after_forward": False}).reshard_after_forward


@pytest.mark.parametrize(
    ("fmt", "data"),
    [
        (
            "accelerate",
            {
                "distributed_type": "FSDP",
                "num_processes": 4,
                "fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": False},
            },
        ),
        (
            "torchtune",
            {"model": {"_component_": "torchtune.models.llama3_2.llama3_2_1b"}, "fsdp_reshard_after_forward": False},
        ),
        ("training_args", {"fsdp": "full_shard auto_wrap", "fsdp_config": {"reshard_after_forward": False}}),
        ("axolotl", {"base_model": "meta-llama/Llama-3.2-1B", "fsdp_config": {"reshard_after_forward": False}}),
    ],
)
def test_readers_set_it(fmt, data):
    fields, _, _ = configs.module(fmt).to_request(data)
    assert fields["shard"] == "fsdp" and fields["reshard_after_forward"] is False


def test_accelerate_cut_units():
    """accelerate's cut (cabe.parallel.fsdp ``_accelerate_units``) on llama-3.1-8b (untied), FSDP2 over 8 GPUs in
    bf16: the embedding's unit E and the tail T = [final norm, lm_head] gathered in bf16 (128,256 × 4,096 × 2 B =
    1,050,673,152 B each, the norm 8,192 B more); at the loss T twice (its parameters and the all-gather output FSDP2
    frees in the root's post-forward), at the head's backward T once, at a layer's backward the layer alone, E
    prefetched beside the bottom layer and gathered at its own backward; the tail's reduce-scatter input at the top
    layer. The per-layer + root cut holds E + T + a layer at the head's backward."""
    from plan_parts import parts  # (this directory's helper: the plan's StepParts)

    spec = preset("llama-3.1-8b").spec
    setup = TrainingSetup(dtype="bf16", autocast="none", gpus=8, shard="fsdp", batch=1, seq=1024)
    p = parts(spec, setup)
    emb = 128_256 * 4_096 * 2
    tail = emb + 8_192
    layer = p.extra_layer_backward["gathered_params"]
    assert p.extra_forward["gathered_params"] == 2 * tail
    assert p.extra_backward["gathered_params"] == tail
    assert p.extra_layer_backward["prefetched_params"] == emb and p.extra_above_bottom["prefetched_params"] == layer
    assert p.extra_layer_backward["reduce_scatter_input"] == tail
    assert p.extra_embedding is not None and p.extra_embedding["gathered_params"] == emb
    q = parts(spec, setup.with_(fsdp_wrap="layers"))
    assert q.extra_backward["gathered_params"] == emb + tail + layer
