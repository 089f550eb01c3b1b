"""Each config format read from a realistic file (tests/configs/files) into a cabe request.

The files follow each project's documented fields: TrainingArguments.to_json_string() plus TRL's
SFTConfig fields, BitsAndBytesConfig.to_dict(), LoraConfig.to_dict(), the Hugging Face DeepSpeed
ZeRO-3 offload template, `accelerate config` FSDP output, axolotl's llama-3 qlora example,
torchtune's llama3_1 recipes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cabe import configs
from cabe.configs import _base
from cabe.errors import CabeError, ConfigError

FILES = Path(__file__).parent / "files"


def source(name: str) -> configs.Source:
    return configs.read_source(FILES / name)


def reasons(src: configs.Source) -> dict[str, str]:
    return dict(src.ignored)


@pytest.mark.parametrize(
    "name,fmt",
    [
        ("sft_config.json", "training_args"),
        ("trl_sft_qlora.yaml", "training_args"),
        ("adapter_config.json", "peft_config"),
        ("bnb_config.json", "bnb"),
        ("ds_zero3_offload.json", "deepspeed"),
        ("ds_zero2.json", "deepspeed"),
        ("accelerate_fsdp.yaml", "accelerate"),
        ("accelerate_fsdp2_hybrid.yaml", "accelerate"),
        ("axolotl_llama3_qlora.yml", "axolotl"),
        ("torchtune_8B_qlora_single_device.yaml", "torchtune"),
        ("torchtune_70B_lora.yaml", "torchtune"),
    ],
)
def test_format_detected_from_content(name, fmt):
    assert source(name).format == fmt


def test_every_module_has_the_same_functions():
    for fmt in configs.FORMATS:
        mod = configs.module(fmt)
        assert callable(mod.read) and callable(mod.to_request) and fmt == mod.FORMAT
        data = mod.read(
            FILES
            / {
                "training_args": "sft_config.json",
                "peft_config": "adapter_config.json",
                "bnb": "bnb_config.json",
                "deepspeed": "ds_zero2.json",
                "accelerate": "accelerate_fsdp.yaml",
                "axolotl": "axolotl_llama3_qlora.yml",
                "torchtune": "torchtune_70B_lora.yaml",
                "llama_factory": "llamafactory_train_lora_qwen3_lora_sft.yaml",
                "unsloth": "unsloth_llama31_8b_alpaca.json",
                "requirements": "requirements.txt",
            }[fmt]
        )
        fields, used, ignored = mod.to_request(data)
        assert isinstance(fields, dict) and used and all(isinstance(u, str) for u in used)
        assert all(r in _base.REASONS for _, r in ignored)
        assert not set(used) & {f for f, _ in ignored}


def test_training_arguments_json():
    s = source("sft_config.json")
    assert s.fields == {
        "batch": 4,
        "grad_accum": 8,
        "precision": "bf16-amp",
        "checkpointing": True,
        "optimizer": "paged-adamw-8bit",
        "seq": 2048,
    }
    r = reasons(s)
    assert r["learning_rate"] == "no_effect" and r["torch_compile"] == "not_modeled"
    assert "per_device_train_batch_size" in s.used and "max_length" in s.used


@pytest.mark.parametrize(
    "optim,expected",
    [
        ("adamw_torch", ("adamw", None)),
        ("adamw_torch_fused", ("adamw", "fused")),
        ("adamw_bnb_8bit", ("adamw-8bit", None)),
        ("paged_adamw_8bit", ("paged-adamw-8bit", None)),
        ("paged_adamw_32bit", ("paged-adamw", None)),
        ("adafactor", ("adafactor", None)),
        ("sgd", ("sgd", None)),
        ("lion_32bit", ("lion", None)),
    ],
)
def test_optim_names_as_transformers_spells_them(optim, expected):
    fields, used, _ = configs.module("training_args").to_request({"optim": optim})
    assert (fields["optimizer"], fields.get("optimizer_impl")) == expected and used == ["optim"]


def test_optim_names_match_transformers_enum():
    OptimizerNames = pytest.importorskip("transformers.training_args").OptimizerNames
    names = {o.value for o in OptimizerNames}
    assert set(_base.HF_OPTIMIZERS) - {"adamw_hf", "adamw_apex_fused", "paged_adamw", "lion", "adamw"} <= names


def test_unknown_optim_is_ignored_with_a_reason():
    fields, _used, ignored = configs.module("training_args").to_request({"optim": "apollo_adamw"})
    assert "optimizer" not in fields and ignored == [("optim", "unsupported_value")]


def test_trl_yaml_with_model_config_fields():
    s = source("trl_sft_qlora.yaml")
    assert s.fields["model"] == "llama-3.1-8b"  # -Instruct: same architecture as the preset
    assert s.fields["method"] == "qlora" and s.fields["lora_targets"] == ("all-linear",)
    assert s.fields["attention"] == "flash" and s.fields["seq"] == 4096 and s.fields["double_quant"] is True
    c = configs.combine([s])
    # bf16=True is the Trainer's autocast; torch_dtype: bfloat16 the weights
    assert (c.request["dtype"], c.request["autocast"], c.request["compute_dtype"]) == ("bf16", "bf16", "bf16")


def test_peft_adapter_config():
    s = source("adapter_config.json")
    assert s.fields["method"] == "lora" and s.fields["lora_rank"] == 16 and s.fields["lora_alpha"] == 32
    assert s.fields["model"] == "llama-3.1-8b"
    assert set(s.fields["lora_targets"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    # lora_dropout 0.05: nn.Dropout before each lora_A (a saved mask and copy, cabe.activations.adapters.lora_variants)
    assert s.fields["lora_dropout"] == 0.05 and s.fields["dora"] is False  # "use_dora": false


def test_peft_all_linear_string_and_dora():
    fields, _, ignored = configs.module("peft_config").to_request(
        {"peft_type": "LORA", "r": 8, "target_modules": "all-linear", "use_dora": True}
    )
    assert fields["lora_targets"] == ("all-linear",) and fields["dora"] is True
    assert not any(key == "use_dora" for key, _ in ignored)


def test_peft_other_types_are_a_clear_error():
    with pytest.raises(ConfigError) as e:
        configs.module("peft_config").to_request({"peft_type": "IA3", "target_modules": ["k_proj"]})
    assert e.value.code == "cfg_unsupported"


def test_prompt_tuning_config():
    fields, _, _ = configs.module("peft_config").to_request({"peft_type": "PROMPT_TUNING", "num_virtual_tokens": 30})
    assert fields == {"method": "prompt-tuning", "prompt_tokens": 30}


def test_bitsandbytes_config():
    s = source("bnb_config.json")
    assert s.fields == {"method": "qlora", "quant": "nf4", "double_quant": True, "compute_dtype": "bf16"}


def test_bitsandbytes_4_and_8_bit_contradict():
    with pytest.raises(ConfigError) as e:
        configs.module("bnb").to_request({"load_in_4bit": True, "load_in_8bit": True})
    assert e.value.code == "cfg_contradiction"


def test_deepspeed_zero3_offload_with_auto_values():
    s = source("ds_zero3_offload.json")
    assert s.fields == {"optimizer": "adamw", "shard": "zero3", "offload": "both"}
    r = reasons(s)
    assert r["train_micro_batch_size_per_gpu"] == "auto" and r["bf16.enabled"] == "auto"
    assert r["zero_optimization.stage3_max_live_parameters"] == "not_modeled"
    assert r["zero_optimization.reduce_bucket_size"] == "auto"


def test_deepspeed_zero2_numbers_give_the_world_size():
    s = source("ds_zero2.json")
    # train_batch_size 256 = micro-batch 4 × accumulation 8 × 8 GPUs
    assert s.fields == {
        "batch": 4,
        "grad_accum": 8,
        "precision": "bf16-amp",
        "_engine": "deepspeed",
        "shard": "zero2",
        "gpus": 8,
    }
    assert reasons(s)["zero_optimization.allgather_bucket_size"] == "not_modeled"


def test_deepspeed_bf16_is_its_own_mode_not_autocast():
    # DeepSpeed's bf16.enabled casts the module to bf16 and keeps fp32 master partitions; accelerate turns
    # its autocast off under DeepSpeed (accelerate 1.16 accelerator.py:556-559)
    c = configs.from_files([FILES / "ds_zero2.json"])
    assert (c.request["dtype"], c.request["autocast"], c.request["param_dtype"]) == ("fp32", "none", "bf16")


def test_deepspeed_batch_sizes_that_do_not_divide_contradict():
    with pytest.raises(ConfigError) as e:
        configs.module("deepspeed").to_request(
            {"train_batch_size": 100, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1}
        )
    assert e.value.code == "cfg_contradiction" and e.value.field == "gpus"


def test_deepspeed_bad_stage():
    with pytest.raises(ConfigError) as e:
        configs.module("deepspeed").to_request({"zero_optimization": {"stage": 4}})
    assert e.value.code == "cfg_bad_value"


def test_accelerate_fsdp():
    s = source("accelerate_fsdp.yaml")
    assert s.fields == {
        "_engine": "fsdp",
        "shard": "fsdp",
        "gpus": 8,
        "precision": "bf16-amp",
        "checkpointing": True,
        "cpu_ram_efficient_loading": True,
        # no fsdp_version: accelerate's FSDP1, each decoder layer wrapped and the rest in the root unit
        "fsdp_wrap": "layers",
    }
    assert reasons(s)["fsdp_config.fsdp_backward_prefetch"] == "not_modeled"


def test_accelerate_fsdp_bf16_gathers_bf16_over_fp32_masters():
    # accelerate 1.16 under FSDP with mixed_precision bf16: MixedPrecision(Policy)(param_dtype=bf16), trainable
    # parameters upcast to fp32 (utils/fsdp_utils.py:800-806), forward under autocast (accelerator.py:1791-1799)
    c = configs.from_files([FILES / "accelerate_fsdp.yaml"])
    assert (c.request["dtype"], c.request["autocast"], c.request["param_dtype"]) == ("fp32", "bf16", "bf16")


def test_accelerate_fsdp2_hybrid_two_nodes_with_offload():
    s = source("accelerate_fsdp2_hybrid.yaml")
    assert s.fields == {
        "_engine": "fsdp",
        "shard": "fsdp-hybrid",
        "offload": "both",
        "precision": "bf16-amp",
        "gpus": 16,
        "gpus_per_node": 8,
        "cpu_ram_efficient_loading": True,
    }


@pytest.mark.parametrize(("strategy", "read"), [("FULL_SHARD", False), ("NO_SHARD", None)])
def test_accelerate_cpu_ram_efficient_loading(strategy, read):
    fields, _, ignored = configs.module("accelerate").to_request(
        {
            "distributed_type": "FSDP",
            "num_processes": 4,
            "fsdp_config": {"fsdp_cpu_ram_efficient_loading": False, "fsdp_sharding_strategy": strategy},
        }
    )
    assert fields.get("cpu_ram_efficient_loading") is read  # DDP loads its own way: no effect there
    assert (read is None) == (("fsdp_config.fsdp_cpu_ram_efficient_loading", "no_effect") in ignored)


@pytest.mark.parametrize(("fsdp", "read"), [("full_shard auto_wrap", False), ("shard_grad_op", None)])
def test_training_args_cpu_ram_efficient_loading(fsdp, read):
    """TrainingArguments' ``fsdp_config.cpu_ram_efficient_loading`` (transformers 5.25 training_args.py: handed to
    accelerate's FSDP plugin); read only where the words shard the whole model (SHARD_GRAD_OP is planned as ZeRO-2)."""
    fields, _, ignored = configs.module("training_args").to_request(
        {"output_dir": "out", "fsdp": fsdp, "fsdp_config": {"cpu_ram_efficient_loading": False}}
    )
    assert fields.get("cpu_ram_efficient_loading") is read
    assert (read is None) == (("fsdp_config.cpu_ram_efficient_loading", "no_effect") in ignored)


@pytest.mark.parametrize(
    "strategy,shard",
    [
        ("FULL_SHARD", "fsdp"),
        ("SHARD_GRAD_OP", "zero2"),
        ("HYBRID_SHARD", "fsdp-hybrid"),
        ("NO_SHARD", "ddp"),
        (1, "fsdp"),
    ],
)
def test_accelerate_sharding_strategies(strategy, shard):
    fields, _, _ = configs.module("accelerate").to_request(
        {"distributed_type": "FSDP", "num_processes": 4, "fsdp_config": {"fsdp_sharding_strategy": strategy}}
    )
    assert fields["shard"] == shard


def test_accelerate_deepspeed_plugin():
    fields, _, _ = configs.module("accelerate").to_request(
        {
            "distributed_type": "DEEPSPEED",
            "num_processes": 8,
            "deepspeed_config": {
                "zero_stage": 2,
                "offload_optimizer_device": "cpu",
                "offload_param_device": "none",
                "gradient_accumulation_steps": 4,
            },
        }
    )
    assert fields == {"_engine": "deepspeed", "shard": "zero2", "offload": "optimizer", "gpus": 8, "grad_accum": 4}


def test_axolotl_qlora():
    s = source("axolotl_llama3_qlora.yml")
    assert s.fields == {
        "model": "llama-3.1-8b",
        "method": "qlora",
        "seq": 4096,
        "lora_rank": 32,
        "lora_alpha": 16,
        "lora_targets": ("all-linear",),
        "lora_dropout": 0.05,
        "grad_accum": 4,
        "batch": 2,
        "optimizer": "paged-adamw",
        "precision": "bf16",
        "checkpointing": True,
        "attention": "flash",
        "packing": "packed",  # sample_packing: true (flash: the varlen path, as padded rows cost)
        "recipe": "axolotl",  # an axolotl file is an axolotl run
    }
    assert "sample_packing" not in reasons(s)
    assert "wandb_project" not in reasons(s)  # empty options are not noise


def test_axolotl_deepspeed_and_fsdp():
    fields, _, ignored = configs.module("axolotl").to_request(
        {"base_model": "Qwen/Qwen2.5-7B", "deepspeed": "deepspeed_configs/zero3_bf16.json", "micro_batch_size": 1}
    )
    assert fields["model"] == "qwen2.5-7b" and ("deepspeed", "other_file") in ignored
    fields, _, _ = configs.module("axolotl").to_request(
        {"base_model": "x/y", "fsdp": ["full_shard", "auto_wrap"], "fsdp_config": {"fsdp_offload_params": True}}
    )
    assert fields["shard"] == "fsdp" and fields["offload"] == "both" and fields["model"] == "x/y"


def test_axolotl_contradiction():
    with pytest.raises(ConfigError) as e:
        configs.module("axolotl").to_request({"base_model": "m", "adapter": "qlora", "load_in_4bit": False})
    assert e.value.code == "cfg_contradiction"


def test_torchtune_qlora_single_device():
    s = source("torchtune_8B_qlora_single_device.yaml")
    assert s.fields == {
        "model": "llama-3.1-8b",
        "method": "qlora",
        "lora_rank": 8,
        "lora_alpha": 16,
        "lora_targets": ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        "seq": 2048,
        "batch": 2,
        "optimizer": "adamw",
        "optimizer_impl": "fused",
        "grad_accum": 8,
        "precision": "bf16",
        "checkpointing": True,
        "offload_activations": False,  # enable_activation_offloading: False
        # loss: torchtune.modules.loss.CEWithChunkedOutputLoss (num_output_chunks: its default 8)
        "loss": "chunked",
        "loss_chunks": 8,
        "recipe": "torchtune",
    }
    assert "loss" not in reasons(s)


def test_axolotl_loss_plugins():
    """axolotl's loss plugins: cut_cross_entropy (integrations/cut_cross_entropy/args.py:33) and Liger's fused
    linear cross-entropy (integrations/liger/args.py:59)."""
    read = configs.module("axolotl").to_request
    assert read({"base_model": "x/y", "cut_cross_entropy": True})[0]["loss"] == "cce"
    assert read({"base_model": "x/y", "liger_fused_linear_cross_entropy": True})[0]["loss"] == "liger"
    assert "loss" not in read({"base_model": "x/y"})[0]


def test_torchtune_distributed_lora_70b():
    s = source("torchtune_70B_lora.yaml")
    assert s.fields["model"] == "llama-3.1-70b" and s.fields["method"] == "lora" and s.fields["shard"] == "fsdp"
    assert reasons(s)["tokenizer.max_seq_len"] == "null"
    assert "seq" in configs.combine([s]).defaults and "gpus" in configs.combine([s]).defaults


@pytest.mark.parametrize(
    "component,preset,method",
    [
        ("torchtune.models.llama3_1.lora_llama3_1_8b", "llama-3.1-8b", "lora"),
        ("torchtune.models.llama3_2.llama3_2_1b", "llama-3.2-1b", "full"),
        ("torchtune.models.qwen2_5.qlora_qwen2_5_7b_instruct", "qwen2.5-7b", "qlora"),
    ],
)
def test_torchtune_model_names(component, preset, method):
    fields, _, _ = configs.module("torchtune").to_request({"model": {"_component_": component}})
    assert fields["model"] == preset and fields["method"] == method


def test_model_names_map_to_presets_or_pass_through():
    assert _base.model_name("meta-llama/Llama-3.1-8B") == "llama-3.1-8b"
    assert _base.model_name("meta-llama/Llama-3.1-8B-Instruct") == "llama-3.1-8b"
    assert _base.model_name("google/gemma-3-1b-it") == "gemma-3-1b"
    assert _base.model_name("someone/custom-model") == "someone/custom-model"


# ---- combining files ---------------------------------------------------------------------


def test_trainer_peft_and_bnb_together():
    c = configs.from_files([FILES / "sft_config.json", FILES / "adapter_config.json", FILES / "bnb_config.json"])
    r = c.request
    assert r["method"] == "qlora" and r["autocast"] == "bf16" and r["dtype"] == "auto"
    assert r["model"] == "llama-3.1-8b" and r["batch"] == 4 and r["lora_rank"] == 16 and r["quant"] == "nf4"


def test_deepspeed_optimizer_block_wins_over_optim():
    c = configs.from_files([FILES / "ds_zero3_offload.json", FILES / "sft_config.json"])
    assert c.request["optimizer"] == "adamw"
    sft = c.sources[1]
    assert ("optim", "overridden") in sft.ignored and "optim" not in sft.used


def test_conflicting_files_are_a_clear_error():
    with pytest.raises(ConfigError) as e:
        configs.from_files([FILES / "ds_zero2.json", {"per_device_train_batch_size": 8}])
    assert e.value.code == "cfg_conflict" and e.value.field == "batch"
    assert "ds_zero2.json" in e.value.to_dict("en")["message"]


def test_overrides_win_and_are_reported():
    c = configs.from_files([FILES / "torchtune_70B_lora.yaml"], overrides={"seq": 4096, "gpus": 8, "batch": 1})
    assert c.request["seq"] == 4096 and c.request["batch"] == 1 and c.overridden == ["batch"]
    assert c.defaults == []


@pytest.mark.parametrize(
    "text,name,code",
    [
        ("a: [1, 2\n", "bad.yaml", "cfg_malformed"),
        ('{"a": 1,}', "bad.json", "cfg_malformed"),
        ("- just\n- a list\n", "list.yaml", "cfg_not_mapping"),
        ('{"hello": "world"}', "what.json", "cfg_unknown_format"),
        ('{"bf16": true, "fp16": true, "per_device_train_batch_size": 1}', "train.json", "cfg_contradiction"),
        (
            "model:\n  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n  lora_attn_modules: [wq]\n",
            "tt.yaml",
            "cfg_bad_value",
        ),
    ],
)
def test_bad_files_give_a_coded_error(tmp_path, text, name, code):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(CabeError) as e:
        configs.from_files([p])
    assert e.value.code == code
    for lang in ("en", "es"):
        msg = e.value.to_dict(lang)["message"]
        assert "{" not in msg.replace("{'", "") and not msg.startswith("error.")


def test_missing_file_and_unknown_format_option(tmp_path):
    with pytest.raises(ConfigError) as e:
        configs.from_files([tmp_path / "nope.json"])
    assert e.value.code == "cfg_not_found"
    with pytest.raises(ConfigError) as e:
        configs.from_files([FILES / "ds_zero2.json"], fmt="megatron")
    assert e.value.code == "cfg_bad_format"


def test_filename_breaks_ties(tmp_path):
    p = tmp_path / "adapter_config.json"
    p.write_text(json.dumps({"task_type": "CAUSAL_LM"}))
    assert configs.read_source(p).format == "peft_config"


def test_yaml_uses_safe_load_only(tmp_path):
    p = tmp_path / "evil.yaml"
    p.write_text("base_model: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ConfigError) as e:
        configs.from_files([p])
    assert e.value.code == "cfg_malformed"


def test_missing_pyyaml_is_a_missing_dependency(monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "yaml":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    from cabe.errors import MissingDependencyError

    with pytest.raises(MissingDependencyError) as e:
        configs.from_files([FILES / "axolotl_llama3_qlora.yml"])
    assert e.value.params["package"] == "pyyaml"


# ---- pip requirements: the transformers line (cabe.configs.requirements) ----
import pytest as _pytest  # noqa: E402


@_pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("torch==2.5.1\ntransformers==4.51.3  # pinned\npeft==0.15.2\n", "4.51.3"),
        ("-r base.txt\ntransformers[torch]===4.57.6 ; python_version >= '3.10'\n", "4.57.6"),
        ("transformers~=4.51\n", "4"),
        ("transformers>=4.46,<5\n", "4"),
        ("transformers>=5.0\n", None),  # no upper bound: the line is not decided
        ("Transformers == 5.25.0\n", "5.25.0"),
    ],
)
def test_requirements_name_the_transformers_line(tmp_path, text, expected):
    from cabe import configs

    path = tmp_path / "requirements.txt"
    path.write_text(text)
    src = configs.read_source(str(path))
    assert src.format == "requirements"
    assert src.fields.get("transformers") == expected


def test_a_text_that_is_not_requirements_is_not_read_as_them(tmp_path):
    from cabe.configs import _base

    assert _base.requirements_lines("just some words\n") is None
    assert _base.requirements_lines("# only a comment\n") is None
    assert _base.requirements_lines("numpy\n") is None  # no specifier: nothing to read


def test_a_requirements_file_changes_the_estimate(tmp_path):
    from cabe import api, configs

    path = tmp_path / "requirements.txt"
    path.write_text("transformers==4.51.3\n")
    combined = configs.from_files([str(path)], overrides={"model": "mixtral-8x7b"})
    request = {**combined.request, "method": "qlora"}
    v4 = api.estimate_json(request)
    v5 = api.estimate_json({**request, "transformers": "5"})
    assert v4["setup"]["transformers"] == "4.51.3" and v4["total_bytes"] < v5["total_bytes"] / 3


@pytest.mark.parametrize(("version", "wrap"), [(1, "layers"), (2, None)])
def test_fsdp_version_picks_the_wrapping(version, wrap):
    """FSDP1 wraps each decoder layer and leaves the rest in the root unit (cabe's ``layers``); FSDP2 is accelerate's
    own cut (the default, ``accelerate``): accelerate's config and TrainingArguments' fsdp_config alike."""
    fields, _, _ = configs.module("accelerate").to_request(
        {"distributed_type": "FSDP", "num_processes": 4, "fsdp_config": {"fsdp_version": version}}
    )
    assert fields.get("fsdp_wrap") == wrap
    fields, _, _ = configs.module("training_args").to_request(
        {"output_dir": "o", "fsdp": "full_shard auto_wrap", "fsdp_config": {"version": version}}
    )
    assert fields.get("fsdp_wrap") == wrap
