"""Options that would change nothing here are refused, never dropped without a word (style: no ignored option):
``--loss-chunks`` beside a loss that does not chunk, ``--optimizer-impl`` for an optimizer with one kernel; and a
LoRA target that matches no module beside targets that do is named in a note, as PEFT drops it."""

from __future__ import annotations

import pytest

from cabe import api
from cabe.analytic import estimate_model
from cabe.errors import InvalidValueError
from cabe.models import preset
from cabe.report.text import format_report
from cabe.training import TrainingSetup

LLAMA = preset("llama-3.2-1b").spec


@pytest.mark.parametrize(
    ("body", "loss"),
    [
        ({"loss": "liger", "loss_chunks": 4}, "liger"),
        ({"loss": "cce", "loss_chunks": 16}, "cce"),
        ({"loss_chunks": 4}, "hf"),  # no loss, no recipe: transformers' own
        ({"recipe": "unsloth", "loss_chunks": 4}, "liger"),  # the recipe's loss (data/recipes/unsloth.json)
    ],
)
def test_loss_chunks_needs_the_chunked_loss(body, loss):
    with pytest.raises(InvalidValueError) as e:
        api.setup_from({"model": "llama-3.2-1b", **body})
    assert (e.value.code, e.value.field, e.value.params["loss"]) == ("chunked_only", "loss_chunks", loss)


def test_loss_chunks_acts_with_the_chunked_loss_and_passes_at_its_default():
    assert api.setup_from({"loss": "chunked", "loss_chunks": 4}).loss_chunks == 4
    assert api.setup_from({"recipe": "torchtune", "loss_chunks": 4}).loss_chunks == 4  # torchtune's loss is chunked
    assert api.setup_from({"loss": "liger", "loss_chunks": 8}).loss == "liger"  # the default changes nothing


@pytest.mark.parametrize("opt", ["adamw-8bit", "paged_adamw_8bit", "lion", "adamw-torch-4bit"])
def test_an_implementation_for_a_one_kernel_optimizer_is_refused(opt):
    with pytest.raises(InvalidValueError) as e:
        api.setup_from({"optimizer": opt, "optimizer_impl": "fused"})
    assert (e.value.code, e.value.field) == ("impl_not_read", "optimizer_impl")


@pytest.mark.parametrize("opt", ["adamw", "rmsprop", "adafactor"])
def test_an_implementation_acts_where_the_step_differs(opt):
    # torch's foreach / for-loop steps allocate differently (optimizer._ADAMW_TEMPS, _RMSPROP_TEMPS, _ADAFACTOR_TEMPS)
    assert api.setup_from({"optimizer": opt, "optimizer_impl": "for-loop"}).optimizer_impl == "for-loop"


def test_an_unmatched_lora_target_beside_matched_ones_is_named():
    # PEFT raises only when no target matches (tuners_utils.py inject_adapter); c_attn is GPT-2's name
    kw = dict(method="lora", batch=1, seq=256)
    with_typo = estimate_model(LLAMA, TrainingSetup(**kw, lora_targets=("q_proj", "v_proj", "c_attn")))
    plain = estimate_model(LLAMA, TrainingSetup(**kw, lora_targets=("q_proj", "v_proj")))
    assert with_typo.total_bytes == plain.total_bytes  # the name adapts nothing, as in PEFT
    assert "lora_target_unmatched" in with_typo.notes and "lora_target_unmatched" not in plain.notes
    assert with_typo.extra["lora_unmatched"] == "c_attn"
    assert "c_attn" in format_report(with_typo, lang="es")
    with pytest.raises(InvalidValueError) as e:  # none matches: PEFT refuses, so does cabe
        estimate_model(LLAMA, TrainingSetup(**kw, lora_targets=("c_attn",)))
    assert e.value.code == "unknown_lora_target"


def test_one_sequence_padding_free_is_a_plain_row():
    # DataCollatorWithFlattening on one sequence: position_ids 0..s-1 never restart, transformers finds no documents
    # (masking_utils.py:761-762) and SDPA keeps is_causal (flash); traced 2026-12-04 on qwen2.5-0.5b LoRA s512:
    # 2,538,651,648 B both ways, the flash kernel
    kw = dict(method="lora", batch=1, seq=512)
    free = estimate_model(preset("qwen2.5-0.5b").spec, TrainingSetup(**kw, packing="padding-free"))
    plain = estimate_model(preset("qwen2.5-0.5b").spec, TrainingSetup(**kw))
    packed = estimate_model(preset("qwen2.5-0.5b").spec, TrainingSetup(**kw, packing="packed"))
    assert free.total_bytes == plain.total_bytes < packed.total_bytes
    assert free.setup["packing"] == "padding-free"  # the report keeps the request


def test_the_page_names_the_unmatched_target():
    pytest.importorskip("jinja2")
    from cabe.web.page import render_plan_results

    html = render_plan_results(
        {"model": "llama-3.2-1b", "method": "lora", "lora_targets": "q_proj,c_attn", "seq": "256"}, "en"
    )
    assert "LoRA targets c_attn match no module" in html


def test_packing_with_prompt_tuning_is_refused():
    # peft 0.21.2 peft_model.py:1668-1674: prompt tuning drops position_ids, so no document is told apart
    with pytest.raises(InvalidValueError) as e:
        TrainingSetup(method="prompt-tuning", packing="padding-free", batch=2)
    assert (e.value.code, e.value.field) == ("packing_prompt_tuning", "packing")


def test_gpus_per_node_on_one_gpu_is_refused():
    # one GPU is one node: the plan's nodes = ceil(1 / gpus_per_node) = 1 and its per-node share min(1, n) = 1
    # whatever n is (cabe.parallel.plan), so a value other than the default would change nothing
    for body in ({"gpus_per_node": 4}, {"gpus": 1, "gpus_per_node": 2}, {"gpus": "1", "gpus_per_node": "16"}):
        with pytest.raises(InvalidValueError) as e:
            api.setup_from({"model": "llama-3.2-1b", **body})
        assert (e.value.code, e.value.field) == ("one_gpu_per_node", "gpus_per_node")
    assert api.setup_from({"gpus_per_node": 8}).gpus_per_node == 8  # the default, as a whole form sends it
    assert api.setup_from({"gpus": 4, "shard": "fsdp-hybrid", "gpus_per_node": 2}).gpus_per_node == 2


def test_gpus_per_node_acts_on_several_gpus():
    # fsdp-hybrid shards within a node: 2 per node over 4 GPUs shards in pairs, 4 per node over all four
    one = estimate_model(LLAMA, TrainingSetup(gpus=4, shard="fsdp-hybrid", gpus_per_node=2)).total_bytes
    four = estimate_model(LLAMA, TrainingSetup(gpus=4, shard="fsdp-hybrid", gpus_per_node=4)).total_bytes
    assert one > four
