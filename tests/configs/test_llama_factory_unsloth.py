"""The LLaMA-Factory and unsloth readers on their projects' own examples (tests/configs/files):

* ``llamafactory_*``: LLaMA-Factory's examples/ at commit ff6d4d1 (the first line of each file names it), and
  one LoRA file with the memory options of its hparams switched on;
* ``unsloth_*``: the keyword arguments of unsloth's QLoRA test (tests/qlora/test_unsloth_qlora_train_and_merge.py)
  and of its Llama 3.1 Alpaca notebook, in cabe's unsloth format (docs/unsloth-config.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cabe import configs
from cabe.configs import llama_factory, unsloth
from cabe.errors import ConfigError

FILES = Path(__file__).parent / "files"


def source(name: str) -> configs.Source:
    return configs.read_source(FILES / name)


def request(name: str) -> dict:
    return configs.combine([source(name)]).request


@pytest.mark.parametrize(
    "name,fmt",
    [
        ("llamafactory_train_lora_qwen3_lora_sft.yaml", "llama_factory"),
        ("llamafactory_train_qlora_qwen3_lora_sft_otfq.yaml", "llama_factory"),
        ("llamafactory_galore_llama3_full_sft.yaml", "llama_factory"),
        ("llamafactory_llama_pro_llama3_freeze_sft.yaml", "llama_factory"),
        ("llamafactory_llama3_lora_liger_neat.yaml", "llama_factory"),
        ("unsloth_llama31_8b_alpaca.json", "unsloth"),
        ("unsloth_qlora_llama32_1b.yaml", "unsloth"),
    ],
)
def test_detected_from_content(name, fmt):
    assert source(name).format == fmt


def test_llama_factory_lora_example_takes_its_defaults():
    # examples/train_lora/qwen3_lora_sft.yaml: lora_rank 8, lora_target all, cutoff_len 2048, bf16
    r = request("llamafactory_train_lora_qwen3_lora_sft.yaml")
    assert r["method"] == "lora" and r["lora_rank"] == 8
    assert r["lora_targets"] == ("all-linear",)  # "all": every Linear but lm_head (misc.py:28-52)
    assert r["lora_alpha"] == 16.0  # lora_rank * 2 (finetuning_args.py:587)
    assert r["seq"] == 2048  # 2048 is a multiple of 8 already (sft collator pad_to_multiple_of=8)
    assert r["checkpointing"] is True  # on unless disable_gradient_checkpointing (model_args.py:145)
    assert (r["dtype"], r["autocast"]) == ("auto", "bf16")  # torch_dtype="auto" (loader.py:154), bf16: true
    assert (r["batch"], r["grad_accum"], r["recipe"]) == (1, 8, "llama-factory")


def test_llama_factory_quantization_bit_4_is_qlora():
    r = request("llamafactory_train_qlora_qwen3_lora_sft_otfq.yaml")
    assert r["method"] == "qlora" and r["compute_dtype"] == "bf16"
    assert "quantization_bit" in source("llamafactory_train_qlora_qwen3_lora_sft_otfq.yaml").used


def test_llama_factory_memory_options():
    s = source("llamafactory_llama3_lora_liger_neat.yaml")
    r = configs.combine([s]).request
    assert r["model"] == "llama-3.1-8b"  # the -Instruct sibling maps to the preset
    assert r["attention"] == "flash"  # flash_attn: fa2
    assert r["loss"] == "liger"  # enable_liger_kernel (liger_kernel.py:97-110)
    assert dict(s.ignored)["enable_liger_kernel.kernels"] == "not_modeled"  # RMSNorm, SwiGLU, RoPE
    assert r["offload_activations"] is True and r["checkpointing"] is True  # use_unsloth_gc
    assert r["packing"] == "packed"  # neat_packing: block-diagonal attention
    # cutoff_len 4095 with packing: rows of 4094 (data_args.py:188-189) padded to a multiple of 8 -> 4096
    assert r["seq"] == 4096
    assert (r["lora_rank"], r["lora_alpha"], r["lora_dropout"], r["dora"]) == (16, 32.0, 0.05, True)
    assert r["lora_targets"] == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert r["optimizer"] == "adamw" and "optimizer_impl" not in r  # optim: adamw_torch (foreach on CUDA)


def test_llama_factory_galore_full():
    # examples/extras/galore/llama3_full_sft.yaml: full, use_galore, layerwise, rank 128, pure_bf16
    r = request("llamafactory_galore_llama3_full_sft.yaml")
    assert r["method"] == "full" and r["optimizer"] == "galore-adamw-layerwise"
    assert r["galore_rank"] == 128 and r["galore_targets"] == ("all-but-lm-head",)
    # pure_bf16: no fp32 cast of what trains (adapter.py:343), no bf16 / fp16 flag: no autocast
    assert (r["dtype"], r["autocast"]) == ("auto", "none")


def test_llama_factory_full_training_is_fp32_weights_under_autocast():
    r = configs.combine([configs.read_source({"finetuning_type": "full", "bf16": True})]).request
    assert (r["method"], r["dtype"], r["autocast"]) == ("full", "fp32", "bf16")  # adapter.py:347-352


def test_llama_factory_freeze_defaults_and_refusals():
    r = configs.combine([configs.read_source({"finetuning_type": "freeze", "cutoff_len": 1025})]).request
    assert r["trainable_layers"] == 2  # finetuning_args.py:23-24
    assert r["seq"] == 1032  # 1025 rounded up to a multiple of 8
    with pytest.raises(ConfigError) as e:  # the first n layers: not cabe's freeze
        configs.read_source({"finetuning_type": "freeze", "freeze_trainable_layers": -2})
    assert e.value.code == "cfg_unsupported"
    with pytest.raises(ConfigError) as e:  # adapter.py:330-332
        configs.read_source({"finetuning_type": "full", "quantization_bit": 4})
    assert e.value.code == "cfg_contradiction"
    with pytest.raises(ConfigError) as e:
        configs.read_source({"finetuning_type": "oft", "cutoff_len": 512})
    assert e.value.code == "cfg_unsupported"


def test_llama_factory_reports_what_it_does_not_model():
    s = configs.read_source(
        {
            "finetuning_type": "lora",
            "quantization_bit": 8,
            "stage": "dpo",
            "use_unsloth": True,
            "additional_target": "embed_tokens, lm_head",
        }
    )
    ignored = dict(s.ignored)
    assert ignored["quantization_bit"] == "not_modeled"
    assert ignored["stage"] == "not_modeled"
    assert ignored["use_unsloth"] == "not_modeled"
    # adapter.py:265: PEFT's modules_to_save, names split on commas (finetuning_args.py:590)
    assert s.fields["modules_to_save"] == ("embed_tokens", "lm_head")
    assert s.fields["method"] == "lora"  # 8 bits is not QLoRA


def test_llama_factory_checkpointing_switches():
    off = configs.read_source({"finetuning_type": "lora", "disable_gradient_checkpointing": True})
    assert off.fields["checkpointing"] is False
    gc_off = configs.read_source({"finetuning_type": "lora", "gradient_checkpointing": False})
    assert gc_off.fields["checkpointing"] is True  # LLaMA-Factory enables it on its own
    nothing = configs.read_source(
        {"finetuning_type": "lora", "disable_gradient_checkpointing": True, "use_unsloth_gc": True}
    )
    assert "offload_activations" not in nothing.fields
    assert dict(nothing.ignored)["use_unsloth_gc"] == "no_effect"


def test_llama_factory_plain_packing_is_full_rows():
    s = configs.read_source({"finetuning_type": "lora", "packing": True, "cutoff_len": 2048})
    assert "packing" not in s.fields and "packing" in s.used  # one causal row (supervised.py:216)
    assert s.fields["seq"] == 2048  # 2047 rounded up to a multiple of 8


def test_llama_factory_default_method_is_lora():
    r = configs.combine([configs.read_source({"cutoff_len": 512, "stage": "sft", "template": "llama3"})]).request
    assert (r["method"], r["lora_targets"], r["seq"]) == ("lora", ("all-linear",), 512)
    assert llama_factory.looks_like({"stage": "sft", "template": "llama3"})


def test_unsloth_notebook():
    s = source("unsloth_llama31_8b_alpaca.json")
    r = configs.combine([s]).request
    assert r["model"] == "llama-3.1-8b"  # unsloth/Meta-Llama-3.1-8B: Meta's Llama-3.1-8B under its older name
    assert r["method"] == "qlora" and (r["quant"], r["double_quant"]) == ("nf4", True)  # llama.py:2620-2626
    assert (r["lora_rank"], r["lora_alpha"]) == (16, 16.0)
    assert r["lora_targets"] == unsloth.DEFAULT_TARGETS
    assert (r["batch"], r["grad_accum"], r["seq"]) == (2, 4, 2048)
    assert r["optimizer"] == "adamw-8bit"
    assert (r["dtype"], r["autocast"], r["compute_dtype"]) == ("bf16", "bf16", "bf16")
    # use_gradient_checkpointing="unsloth" at 2048 tokens: checkpointed and offloaded
    assert r["checkpointing"] is True and r["offload_activations"] is True
    assert r["packing"] == "padding-free"  # auto-enabled (trainer.py:903-912), packing: false does not stop it
    assert r["recipe"] == "unsloth"
    assert dict(s.ignored)["_comment"] == "unknown"


def test_unsloth_test_script():
    r = request("unsloth_qlora_llama32_1b.yaml")
    assert r["model"] == "llama-3.2-1b" and r["method"] == "qlora"
    assert (r["lora_rank"], r["lora_alpha"], r["batch"], r["seq"]) == (64, 64.0, 5, 512)
    assert r["checkpointing"] is False and r["offload_activations"] is False


def test_unsloth_defaults_and_sequence_rules():
    base = {"from_pretrained": {"model_name": "x"}, "get_peft_model": {}}
    r = configs.read_source(base).fields
    assert r["method"] == "qlora"  # load_in_4bit=True by default (loader.py:414)
    assert (r["lora_rank"], r["seq"]) == (16, 2048)
    assert r["checkpointing"] is True and r["offload_activations"] is True
    short = configs.read_source({"from_pretrained": {"max_seq_length": 384}, "get_peft_model": {}}).fields
    assert short["checkpointing"] is True and short["offload_activations"] is False  # _utils.py:374-378
    capped = configs.read_source(
        {"from_pretrained": {"max_seq_length": 1024}, "get_peft_model": {}, "args": {"max_seq_length": 4096}}
    )
    assert capped.fields["seq"] == 1024  # capped at the model's (rl.py:2520-2524)
    replaced = configs.read_source({"from_pretrained": {}, "get_peft_model": {}, "args": {"max_length": 512}})
    assert replaced.fields["seq"] == 2048 and dict(replaced.ignored)["args.max_length"] == "overridden"


def test_unsloth_methods_and_refusals():
    sixteen = configs.read_source({"from_pretrained": {"load_in_16bit": True}, "get_peft_model": {"r": 8}})
    assert sixteen.fields["method"] == "lora"
    full = configs.read_source({"from_pretrained": {"full_finetuning": True}})
    assert full.fields["method"] == "full"
    with pytest.raises(ConfigError) as e:
        configs.read_source({"from_pretrained": {"model_name": "x"}})
    assert e.value.code == "cfg_unsupported"
    whole = configs.read_source(
        {"from_pretrained": {}, "get_peft_model": {"target_modules": ["q_proj", "lm_head", "embed_tokens"]}}
    )
    # embed_tokens among the targets is trained whole (llama.py:3318-3328); lm_head is a LoRA target since #4106
    assert whole.fields["lora_targets"] == ("q_proj", "lm_head")
    assert whole.fields["modules_to_save"] == ("embed_tokens",)
    assert dict(whole.ignored)["get_peft_model.modules_to_save.offload"] == "not_modeled"  # unsloth's own handling
    saved = configs.read_source({"from_pretrained": {}, "get_peft_model": {"modules_to_save": ["lm_head"]}})
    assert saved.fields["modules_to_save"] == ("lm_head",)
    with pytest.raises(ConfigError) as e:
        configs.read_source({"from_pretrained": {}, "get_peft_model": {"modules_to_save": ["score"]}})
    assert e.value.code == "cfg_bad_value"  # llama.py:3380-3390: only lm_head and embed_tokens
    eight = configs.read_source({"from_pretrained": {"load_in_8bit": True}, "get_peft_model": {}})
    assert dict(eight.ignored)["from_pretrained.load_in_8bit"] == "not_modeled"


def test_unsloth_autocast_turned_on_without_flags():
    # rl.py:2414-2420: neither bf16 nor fp16 -> autocast in the model's 16-bit dtype
    r = configs.combine([configs.read_source({"from_pretrained": {"dtype": "float16"}, "get_peft_model": {}})])
    assert (r.request["dtype"], r.request["autocast"]) == ("fp16", "fp16")


@pytest.mark.parametrize(
    ("hub_id", "name"),
    [
        ("unsloth/Meta-Llama-3.1-8B-bnb-4bit", "llama-3.1-8b"),
        ("unsloth/Llama-3.2-1B-Instruct", "llama-3.2-1b"),
        ("unsloth/Qwen3-8B-unsloth-bnb-4bit", "qwen3-8b"),
        ("unsloth/no-such-model", "unsloth/no-such-model"),  # left as given: the Hub resolves it
    ],
)
def test_unsloth_mirrors_map_to_presets(hub_id, name):
    s = configs.read_source({"from_pretrained": {"model_name": hub_id}, "get_peft_model": {}})
    assert s.fields["model"] == name
