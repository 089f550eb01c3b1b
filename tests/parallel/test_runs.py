"""The multi-GPU plan run by run (cabe.parallel.runs): the pipeline stage's runs, FSDP's per-unit buffers sized by each
run's layer, and a model whose layers are alike walked as before."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from plan_parts import both

from cabe.analytic import estimate_model
from cabe.models import preset
from cabe.parallel.layout import Layout
from cabe.parallel.runs import stage_runs
from cabe.step import LayerRun, _ends, timeline
from cabe.training import TrainingSetup


def _parts(spec: Any, setup: TrainingSetup) -> Any:
    """The one-GPU parts of ``setup`` as estimate_model builds them, then the plan's."""
    return both(spec, setup)


def test_a_stage_keeps_its_own_layers_of_each_run():
    # 5 layers on 2 stages: stage 0 holds layers 0-2, stage 1 layers 3-4 (the first stages take the rest); the runs
    # are 2 layers (0-1) then 3 (2-4), the top one checkpointed with its copies cached
    runs = (LayerRun(2, 10, 0, 1), LayerRun(3, 20, 0, 2, cached_count=3))
    spec = SimpleNamespace(num_layers=5)
    lay = Layout(2, 1, 1, 2, 1, "none", 1, 0, 5)
    assert [(r.count, r.grads, r.cached_count) for r in stage_runs(runs, spec, lay)] == [(2, 10, 0), (1, 20, 1)]
    assert [(r.count, r.cached_count) for r in stage_runs(runs, spec, lay.at_stage(1))] == [(2, 2)]
    # freeze's path: the top 2 layers only, both on stage 1
    assert stage_runs((LayerRun(2, 20, 0, 2),), spec, lay) == ()


def test_the_layers_next_to_the_paths_ends_are_walked_where_the_buffers_step():
    assert _ends(4, True, True, False) == (0, 3)
    assert _ends(4, True, True, True) == (0, 1, 2, 3)  # below the top and above the bottom: both buffers held
    assert _ends(5, False, False, True) == (0, 4)  # a run inside the path: both held at its ends already
    assert _ends(2, True, True, True) == (0, 1)


def test_an_fsdp_unit_of_a_moe_layer_gathers_its_own_layer():
    """DeepSeek-V3 full on 8 GPUs, FSDP2 in bf16: 3 dense layers then 58 MoE layers. A unit gathers its layer whole
    (bf16, 2 bytes an element): a MoE layer's MLP is the router 256 × 7168, 256 experts and a shared one of
    3 × 7168 × 2048 = 11,320,164,352 elements; a dense layer's 3 × 7168 × 18432 = 396,361,728 (their attention and
    norms alike, tests/families/test_deepseek_v3.py)."""
    spec = preset("deepseek-v3").spec
    one, new = _parts(spec, TrainingSetup(dtype="bf16", gpus=8, shard="fsdp", batch=1, seq=1024))
    assert [r.count for r in one.runs] == [3, 58] == [r.count for r in new.runs]
    # (the unit running backward: accelerate's cut names it apart from the head's, the layers' cut with the root)
    dense, moe = (r.buffers.extra_layer_backward["gathered_params"] for r in new.runs)
    assert moe - dense == 2 * (11_320_164_352 - 396_361_728) == 21_847_605_248
    _, layers = _parts(spec, TrainingSetup(dtype="bf16", gpus=8, shard="fsdp", batch=1, seq=1024, fsdp_wrap="layers"))
    dense, moe = (r.buffers.extra_backward["gathered_params"] for r in layers.runs)
    assert moe - dense == 21_847_605_248
    # the unsharded gradients of the unit running backward and the reduce-scatter input too
    dense, moe = (r.buffers.extra_layer_grads["unsharded_grads"] for r in new.runs)
    assert moe - dense == 21_847_605_248
    # the gradients are each run's share of the layers' on this GPU, as its tensors are: a MoE layer's
    # 187,105,280 + 16,384 + 11,320,164,352 = 11,507,286,016 elements, a dense one's 583,483,392 (attention
    # 187,105,280, norms 16,384)
    assert abs(new.runs[1].grads / new.runs[0].grads - 11_507_286_016 / 583_483_392) < 1e-6


def test_a_model_whose_layers_are_alike_walks_as_its_mean_layer():
    spec = preset("llama-3.2-1b").spec
    for kw in (dict(shard="fsdp", gpus=8), dict(shard="ddp", gpus=2), dict(shard="fsdp", gpus=8, checkpointing=True)):
        _, new = _parts(spec, TrainingSetup(dtype="bf16", batch=2, seq=512, **kw))
        assert all(r.buffers is None for r in new.runs)
        walked = [sum(m.components.values()) for m in timeline(new)]
        assert max(walked) == max(sum(m.components.values()) for m in timeline(replace(new, runs=())))
    assert estimate_model(spec, TrainingSetup(dtype="bf16", batch=2, seq=512, shard="fsdp", gpus=8)).total_bytes
