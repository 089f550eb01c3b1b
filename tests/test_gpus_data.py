"""The GPU catalog ``src/cabe/data/gpus.json``: shape, types and sane ranges.

Reads the JSON directly (no cabe loader), so it checks the data file itself.
"""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

GiB = 1 << 30
MiB = 1 << 20


def _load() -> dict:
    text = resources.files("cabe").joinpath("data").joinpath("gpus.json").read_text(encoding="utf-8")
    return json.loads(text)


DOC = _load()
GPUS = DOC["gpus"]
IDS = [g.get("name", "?") for g in GPUS]

NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
ARCH_CC = {
    "volta": {"7.0"},
    "turing": {"7.5"},
    "ampere": {"8.0", "8.6", "8.7"},
    "ada": {"8.9"},
    "hopper": {"9.0"},
    "blackwell": {"10.0", "10.3", "12.0", "12.1"},
    "cdna2": {"9.0"},
    "cdna3": {"9.4"},
    "cdna4": {"9.5"},
}
AMD_ARCHS = {"cdna2", "cdna3", "cdna4"}
#: The cards of the 2026 catalog (issue 13): each cites where its figures come from (``spec_source``).
CATALOG_2026 = (
    "h20",
    "l20",
    "l40",
    "a800-80gb-sxm",
    "h800-sxm",
    "b300",
    "gb200",
    "gb300",
    "mi325x",
    "mi355x",
    "rtx-5060-ti-16gb",
    "rtx-5070-ti",
    "rtx-5080",
)

FIELDS = {
    "name": str,
    "display": str,
    "vendor": str,
    "segment": str,
    "memory_gb_nominal": (int, float),
    "memory_bytes": int,
    "memory_bytes_source": str,
    "bf16": bool,
    "fp8": bool,
    "fp4": bool,
    "architecture": str,
    "compute_capability": str,
    "cuda_context_bytes": int,
    "memory_bandwidth_gbs": (int, float),
    "bf16_tflops_dense": (int, float, type(None)),
    "fp16_tflops_dense": (int, float),
}
OPTIONAL = {"notes": str, "spec_source": str}


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def test_top_level_shape():
    assert set(DOC) == {"_notes", "aliases", "gpus"}
    assert isinstance(DOC["_notes"], dict) and DOC["_notes"]
    for key in ("memory_bytes", "cuda_context_bytes", "bf16_tflops_dense"):
        assert isinstance(DOC["_notes"].get(key), str) and DOC["_notes"][key].strip()
    assert isinstance(GPUS, list) and len(GPUS) >= 30


@pytest.mark.parametrize("gpu", GPUS, ids=IDS)
def test_gpu_entry(gpu: dict):
    for key, typ in FIELDS.items():
        assert key in gpu, f"{key} missing"
        value = gpu[key]
        assert isinstance(value, typ), f"{key}={value!r} should be {typ}"
        if typ is not bool:
            assert not isinstance(value, bool), f"{key} is a bool"
    extra = set(gpu) - set(FIELDS) - set(OPTIONAL)
    assert not extra, f"unexpected fields {extra}"
    if "notes" in gpu:
        assert isinstance(gpu["notes"], str) and gpu["notes"].strip()

    assert NAME_RE.match(gpu["name"]), gpu["name"]
    assert gpu["display"].strip() and gpu["memory_bytes_source"].strip()
    assert gpu["vendor"] in {"nvidia", "amd"}
    assert gpu["segment"] in {"consumer", "workstation", "datacenter"}
    assert gpu["architecture"] in ARCH_CC
    assert gpu["compute_capability"] in ARCH_CC[gpu["architecture"]]
    assert (gpu["vendor"] == "amd") == (gpu["architecture"] in AMD_ARCHS)

    nominal = gpu["memory_gb_nominal"]
    assert 8 <= nominal <= 300
    total = gpu["memory_bytes"]
    # The reported total is a little under the nominal size (driver reservation, ECC), never far over it.
    assert 0.88 * nominal * GiB <= total <= nominal * GiB * 1.001 + 512 * MiB, (total, nominal)
    if total == nominal * GiB:
        assert "nominal" in gpu["memory_bytes_source"].lower()

    ctx = gpu["cuda_context_bytes"]
    assert 256 * MiB <= ctx <= int(1.5 * GiB)
    assert total - ctx > 0.85 * total

    assert 100 <= gpu["memory_bandwidth_gbs"] <= 10_000
    assert 5 <= gpu["fp16_tflops_dense"] <= 5_000
    if gpu["bf16"]:
        assert _is_number(gpu["bf16_tflops_dense"])
        assert 5 <= gpu["bf16_tflops_dense"] <= 5_000
    else:
        assert gpu["bf16_tflops_dense"] is None
    # bf16 from Ampere / CDNA2 on; fp8 from Ada / Hopper / CDNA3 on.
    assert gpu["bf16"] == (gpu["architecture"] not in {"volta", "turing"})
    if gpu["fp8"]:
        assert gpu["architecture"] in {"ada", "hopper", "blackwell", "cdna3", "cdna4"}
    if gpu["architecture"] in {"ada", "hopper", "blackwell", "cdna4"}:
        assert gpu["fp8"]
    # fp4 tensor cores (NVFP4 / MXFP4) exactly on Blackwell and CDNA4.
    assert gpu["fp4"] == (gpu["architecture"] in {"blackwell", "cdna4"})
    if "spec_source" in gpu:
        assert len(gpu["spec_source"]) > 40 and "." in gpu["spec_source"]


def test_names_unique():
    names = [g["name"] for g in GPUS]
    assert len(names) == len(set(names))
    displays = [g["display"] for g in GPUS]
    assert len(displays) == len(set(displays))


def test_aliases():
    aliases = DOC["aliases"]
    names = {g["name"] for g in GPUS}
    assert isinstance(aliases, dict) and aliases
    for alias, target in aliases.items():
        assert isinstance(alias, str) and NAME_RE.match(alias), alias
        assert alias not in names, f"alias {alias!r} collides with a GPU name"
        assert target in names, f"alias {alias!r} points at unknown {target!r}"
    # JSON objects cannot hold duplicate keys once parsed; check the raw text too.
    raw = resources.files("cabe").joinpath("data").joinpath("gpus.json").read_text(encoding="utf-8")
    pairs = json.loads(raw, object_pairs_hook=lambda kv: kv)
    alias_pairs = dict(pairs)["aliases"]
    keys = [k for k, _ in alias_pairs]
    assert len(keys) == len(set(keys))
    for short in ("4090", "3090", "a100", "h100", "t4", "l4"):
        assert short in aliases or short in names


def test_catalog_spans_8_to_288_gb():
    nominal = [g["memory_gb_nominal"] for g in GPUS]
    assert min(nominal) == 8
    assert max(nominal) == 288  # B300, GB300, MI355X


@pytest.mark.parametrize("name", CATALOG_2026)
def test_catalog_2026(name):
    by = {g["name"]: g for g in GPUS}
    assert name in by, name
    g = by[name]
    new = name not in ("rtx-5060-ti-16gb", "rtx-5080")  # these two were there before, with their memory sources
    assert not new or g["spec_source"].strip()
    assert g["bf16"] and g["bf16_tflops_dense"] and g["memory_bandwidth_gbs"]


def test_catalog_2026_figures():
    by = {g["name"]: g for g in GPUS}
    # torch's total_memory of the H20, as printed by get_device_properties(): 97285 MiB
    assert by["h20"]["memory_bytes"] == 97285 * MiB
    # nvidia-smi's memory.total where no torch figure was found: B300 275040, GB200 189471, GB300 284208 MiB
    assert by["b300"]["memory_bytes"] == 275040 * MiB
    assert by["gb200"]["memory_bytes"] == 189471 * MiB
    assert by["gb300"]["memory_bytes"] == 284208 * MiB
    for name in ("b300", "gb200", "gb300"):
        assert "nvidia-smi" in by[name]["memory_bytes_source"]
    # export variants: the same memory and dense bf16 as the card they cut down
    assert by["h800-sxm"]["bf16_tflops_dense"] == by["h100-sxm"]["bf16_tflops_dense"] == 989.4
    assert by["a800-80gb-sxm"]["memory_bandwidth_gbs"] == by["a100-80gb-sxm"]["memory_bandwidth_gbs"] == 2039
    # the H20 keeps Hopper's fp8 but about 15% of the H100's tensor throughput: 148 / 989.4
    assert by["h20"]["fp8"] and not by["h20"]["fp4"] and by["h20"]["bf16_tflops_dense"] == 148.0
    # fp4: Blackwell and CDNA4 only
    assert by["b300"]["fp4"] and by["mi355x"]["fp4"] and not by["mi325x"]["fp4"] and not by["h200"]["fp4"]
    # RTX 5070 Ti: 70 SMs x 2452 MHz x 512 FLOPs/clock/SM = 87.9 TFLOPS
    assert round(70 * 2452e6 * 512 / 1e12, 1) == by["rtx-5070-ti"]["bf16_tflops_dense"]


def test_catalog_covers_segments_and_vendors():
    assert {g["segment"] for g in GPUS} == {"consumer", "workstation", "datacenter"}
    assert {g["vendor"] for g in GPUS} == {"nvidia", "amd"}
    names = {g["name"] for g in GPUS}
    for required in (
        "rtx-3090",
        "rtx-4090",
        "rtx-5090",
        "rtx-a6000",
        "t4",
        "v100-16gb",
        "a10g",
        "l4",
        "l40s",
        "a100-40gb-sxm",
        "a100-80gb-sxm",
        "h100-sxm",
        "h100-pcie",
        "h100-nvl",
        "h200",
        "b200",
        "mi300x",
    ):
        assert required in names, required


def test_usable_memory_ordering():
    by = {g["name"]: g for g in GPUS}

    def usable(name: str) -> int:
        return by[name]["memory_bytes"] - by[name]["cuda_context_bytes"]

    assert usable("rtx-3060-12gb") < usable("rtx-4090") < usable("a100-40gb-sxm") < usable("a100-80gb-sxm")
    assert usable("h100-sxm") < usable("h200") < usable("mi300x")
    assert usable("h100-sxm") < usable("h20") < usable("h200") < usable("gb200") < usable("b300") < usable("gb300")
