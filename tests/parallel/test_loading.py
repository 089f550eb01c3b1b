"""Loading the checkpoint (cabe.parallel.loading): the formula per path, golden figures with their arithmetic, the
plan's keys, the FSDP-only field, and a traced ``from_pretrained`` of a tiny Llama (benchmarks/loading/traced.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from cabe import api
from cabe.analytic import estimate_model
from cabe.errors import InvalidValueError
from cabe.models import preset
from cabe.parallel.loading import Sizes, load_memory, path_for
from cabe.training import TrainingSetup

S = Sizes(
    loaded_bytes=400,
    converted_bytes=300,
    checkpoint_bytes=200,
    largest_bytes=40,
    largest_converted_bytes=30,
    largest_quantized_bytes=20,
    unit_bytes=50,
    trainable_bytes=100,
)


@pytest.mark.parametrize(
    ("path", "strategy", "line", "host", "gpu"),
    [
        ("host_full", "ddp", 5, 8 * 300, 400),  # every rank's private copies; the whole model moved to the GPU
        ("host_full", "zero2", 5, 8 * 300, 400 + 100),  # + DeepSpeed's flat copy of the trainable parameters
        ("fsdp_units", "fsdp", 5, 8 * 300, 10 + 50),  # the kept shard + one unit whole
        ("fsdp_rank0", "fsdp", 5, 8 * 300, 10 + 40),  # transformers 5.25 loads on every rank; one full tensor
        ("fsdp_rank0", "fsdp", 4, 1 * 300, 10 + 40),  # 4.x: the node's local rank 0 only
        ("zero3_init", "zero3", 5, 0, 10 + 40),  # rank 0 reads views of the files; one module gathered
        ("device_map", "ddp", 5, 8 * 30, 400 + 20),  # one tensor converted on the host; its 16-bit copy on the GPU
    ],
)
def test_formula_per_path(path, strategy, line, host, gpu):
    got = load_memory(S, path=path, strategy=strategy, per_node=8, resident_bytes=10, transformers_line=line)
    assert (got.host_bytes_per_node, got.gpu_bytes, got.page_cache_bytes_per_node) == (host, gpu, 200)


def test_path_follows_method_strategy_and_flag():
    assert path_for("fsdp", "qlora", True) == "device_map"  # bitsandbytes' device_map whatever the engine
    assert path_for("zero3", "full", True) == "zero3_init"
    assert path_for("fsdp-hybrid", "lora", True) == "fsdp_rank0"
    assert path_for("fsdp", "full", False) == "fsdp_units"
    assert [path_for(s, "full", True) for s in ("none", "ddp", "zero1", "zero2")] == ["host_full"] * 4


LLAMA70 = preset("llama-3.1-70b").spec  # a bf16 checkpoint (config dtype)


def _load(**kw):
    d = estimate_model(LLAMA70, TrainingSetup(precision="bf16-amp", gpus=8, batch=1, seq=16, **kw)).extra
    return d["distributed"]


def test_fsdp_70b_golden():
    p = 70_553_706_496
    d = _load(shard="fsdp")
    assert d["load_path"] == "fsdp_rank0"
    # bf16-amp keeps fp32 masters: every tensor converted from the bf16 checkpoint, a private fp32 copy per rank;
    # transformers 5.25 loads on all 8 ranks: 8 × 4 B × P
    assert d["host_ram_load_peak_bytes_per_node"] == 8 * 4 * p
    assert d["host_page_cache_load_bytes_per_node"] == 2 * p  # the bf16 files, once per node
    # the GPU: its fp32 shard (weights_bytes) + the largest tensor whole in fp32, the embedding 128,256 × 8,192
    assert d["gpu_load_peak_bytes"] == d["per_gpu"]["weights_bytes"] + 128_256 * 8_192 * 4
    assert _load(shard="fsdp", transformers="4.57.1")["host_ram_load_peak_bytes_per_node"] == 4 * p
    units = _load(shard="fsdp", cpu_ram_efficient_loading=False)
    assert units["load_path"] == "fsdp_units" and units["gpu_load_peak_bytes"] > d["gpu_load_peak_bytes"]


def test_zero3_and_bf16_load_no_private_host_memory():
    assert _load(shard="zero3")["host_ram_load_peak_bytes_per_node"] == 0
    d = estimate_model(LLAMA70, TrainingSetup(precision="bf16", gpus=8, shard="ddp", batch=1, seq=16))
    assert d.extra["distributed"]["host_ram_load_peak_bytes_per_node"] == 0  # bf16 from bf16: views of the files


def test_the_flag_is_fsdp_only():
    with pytest.raises(InvalidValueError) as e:
        api.setup_from({"gpus": 8, "shard": "zero3", "cpu_ram_efficient_loading": False})
    assert (e.value.code, e.value.field) == ("fsdp_only", "cpu_ram_efficient_loading")
    assert api.setup_from({"gpus": 8, "shard": "fsdp", "cpu_ram_efficient_loading": False}).shard == "fsdp"


def _traced():
    here = Path(__file__).resolve().parents[2] / "benchmarks" / "loading" / "traced.py"
    spec = importlib.util.spec_from_file_location("loading_traced", here)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["loading_traced"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.trace
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_traced_load_matches(tmp_path, dtype):
    pytest.importorskip("transformers")
    t = _traced()
    config = t.save(str(tmp_path), t.TINY, shard="100KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    got = t.load_once(str(tmp_path), dtype)
    m = t.modelled(config, dtype, 1, False)
    # the parameters' storages: private copies exactly as modelled (fp32 from bf16: all; bf16: none), the rest
    # views of the mapped files, as many bytes as cabe's page cache figure
    assert got["private_bytes"] == m["private_per_process_bytes"]
    if dtype == "bf16":
        assert got["mapped_bytes"] == m["page_cache_bytes_per_node"]
