"""``cabe from-config``: the same report as ``cabe estimate``, plus what was read from the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cabe.cli import main

FILES = Path(__file__).parent / "files"


def run(capsys, *argv):
    rc = main(["from-config", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def estimate_json(capsys, *argv):
    assert main(["estimate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_single_gpu_end_to_end_equals_cabe_estimate(capsys):
    rc, out, err = run(capsys, FILES / "torchtune_8B_qlora_single_device.yaml", "--json")
    assert rc == 0, err
    got = json.loads(out)
    fc = got.pop("from_config")
    want = estimate_json(
        capsys,
        "--model",
        "llama-3.1-8b",
        "--method",
        "qlora",
        "--lora-rank",
        "8",
        "--lora-alpha",
        "16",
        "--lora-targets",
        "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        "--seq",
        "2048",
        "--batch",
        "2",
        "--optimizer",
        "adamw",
        "--optimizer-impl",
        "fused",
        "--grad-accum",
        "8",
        "--precision",
        "bf16",
        "--checkpointing",
        "--compute-dtype",
        "bf16",
        "--recipe",
        "torchtune",
        "--loss",
        "chunked",
    )
    assert got == want
    assert fc["files"] == [{"path": str(FILES / "torchtune_8B_qlora_single_device.yaml"), "format": "torchtune"}]
    assert {"file": str(FILES / "torchtune_8B_qlora_single_device.yaml"), "field": "batch_size"} in fc["used"]
    assert {"file": str(FILES / "torchtune_8B_qlora_single_device.yaml"), "field": "loss._component_"} in fc["used"]
    assert got["loss"]["recipe"] == "torchtune" and got["loss"]["loss"] == "chunked"


def test_text_report_has_the_read_from_section(capsys):
    rc, out, _ = run(
        capsys, FILES / "sft_config.json", FILES / "adapter_config.json", FILES / "bnb_config.json", "--lang", "en"
    )
    assert rc == 0
    assert out.startswith("Peak memory:")
    assert "Read from:" in out and "sft_config.json (TrainingArguments / SFTConfig)" in out
    assert "used: per_device_train_batch_size" in out
    assert "ignored — does not change the GPU memory of a training step: output_dir" in out
    assert "method=qlora" in out


def test_text_report_in_spanish(capsys):
    rc, out, _ = run(capsys, FILES / "axolotl_llama3_qlora.yml", "--lang", "es")
    assert rc == 0 and "Leído de:" in out and "configuración de axolotl" in out


def test_model_override(capsys):
    rc, out, _ = run(capsys, FILES / "axolotl_llama3_qlora.yml", "--model", "qwen2.5-7b", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["model"]["name"] == "qwen2.5-7b" and data["from_config"]["overridden"] == ["model"]


def test_seq_default_is_reported(capsys):
    rc, out, _ = run(capsys, FILES / "torchtune_70B_lora.yaml", "--gpus", "8", "--lang", "en")
    assert rc == 0 and "pass --seq" in out


@pytest.mark.parametrize(
    "files",
    [
        ["accelerate_fsdp.yaml", "sft_config.json", "--model", "llama-3.1-70b"],
        ["ds_zero3_offload.json", "sft_config.json", "--model", "llama-3.1-8b", "--gpus", "4"],
        ["ds_zero2.json", "--model", "llama-3.1-8b"],
        ["torchtune_70B_lora.yaml", "--gpus", "8", "--seq", "4096"],
        ["accelerate_fsdp2_hybrid.yaml", "--model", "llama-3.1-70b", "--seq", "4096"],
    ],
)
def test_multi_gpu_files_pass_the_fields_through(capsys, files):
    args = [FILES / f if f.endswith((".json", ".yaml", ".yml")) else f for f in files]
    rc, out, err = run(capsys, *args, "--json")
    assert rc == 0, err
    data = json.loads(out)
    req = data["from_config"]["request"]
    assert req["shard"] != "none"
    assert data["setup"]["shard"] == req["shard"] and data["setup"]["gpus"] == req.get("gpus", 1)


@pytest.mark.parametrize(
    "text,name",
    [
        ("a: [1, 2\n", "bad.yaml"),
        ('{"a": 1,}', "bad.json"),
        ('{"hello": 1}', "what.json"),
        ('{"bf16": true, "fp16": true, "optim": "sgd"}', "train.json"),
    ],
)
def test_bad_files_exit_2_with_one_sentence(capsys, tmp_path, text, name):
    p = tmp_path / name
    p.write_text(text)
    rc, out, err = run(capsys, p, "--lang", "en")
    assert rc == 2 and out == ""
    assert err.startswith("cabe: ") and "Traceback" not in err and err.count("\n") == 1


def test_bad_file_json_error_object(capsys, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("a: [1")
    rc, out, _ = run(capsys, p, "--json")
    assert rc == 2 and json.loads(out)["error"]["code"] == "cfg_malformed"


def test_conflict_between_files_exits_2(capsys, tmp_path):
    p = tmp_path / "train.json"
    p.write_text(json.dumps({"per_device_train_batch_size": 16}))
    rc, _, err = run(capsys, FILES / "ds_zero2.json", p, "--lang", "en")
    assert rc == 2 and "ds_zero2.json says 4" in err
