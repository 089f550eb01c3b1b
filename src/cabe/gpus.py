"""The GPU catalog (``cabe/data/gpus.json``), loaded lazily, and the "does it fit?" check.

Usable memory = the memory the driver reports minus the CUDA context (kernel images, cuBLAS
workspace). A run fits when PyTorch's reserved memory (peak allocated + allocator slack) plus
the context stays under the card's memory; cabe reports the margin in both directions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from cabe import fp8
from cabe.errors import CabeError, UnknownPresetError
from cabe.report import Report


@dataclass(frozen=True)
class Gpu:
    name: str
    display: str
    vendor: str
    segment: str
    memory_bytes: int
    cuda_context_bytes: int
    bf16: bool
    fp8: bool
    architecture: str
    bf16_tflops_dense: float
    memory_bandwidth_gbs: float
    memory_gb_nominal: float
    #: 4-bit floating-point tensor cores (NVFP4 / MXFP4): Blackwell and CDNA4.
    fp4: bool = False
    #: CUDA compute capability (major, minor); for AMD, what torch reports on ROCm; None where the catalog has none
    compute_capability: tuple[int, int] | None = None

    @property
    def usable_bytes(self) -> int:
        """Memory left for PyTorch once the CUDA context is created."""
        return self.memory_bytes - self.cuda_context_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "display": self.display,
            "vendor": self.vendor,
            "segment": self.segment,
            "memory_bytes": self.memory_bytes,
            "memory_gb_nominal": self.memory_gb_nominal,
            "cuda_context_bytes": self.cuda_context_bytes,
            "usable_bytes": self.usable_bytes,
            "bf16": self.bf16,
            "fp8": self.fp8,
            "fp4": self.fp4,
            "architecture": self.architecture,
            "bf16_tflops_dense": self.bf16_tflops_dense,
            "memory_bandwidth_gbs": self.memory_bandwidth_gbs,
        }


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, Gpu], dict[str, str]]:
    raw = json.loads((resources.files("cabe") / "data" / "gpus.json").read_text(encoding="utf-8"))
    gpus: dict[str, Gpu] = {}
    for g in raw["gpus"]:
        gpus[g["name"]] = Gpu(
            name=g["name"],
            display=g["display"],
            vendor=g["vendor"],
            segment=g["segment"],
            memory_bytes=int(g["memory_bytes"]),
            cuda_context_bytes=int(g["cuda_context_bytes"]),
            bf16=bool(g["bf16"]),
            fp8=bool(g.get("fp8", False)),
            architecture=g.get("architecture", ""),
            bf16_tflops_dense=float(g.get("bf16_tflops_dense") or 0.0),
            memory_bandwidth_gbs=float(g.get("memory_bandwidth_gbs") or 0.0),
            memory_gb_nominal=float(g.get("memory_gb_nominal") or 0.0),
            fp4=bool(g.get("fp4", False)),
            compute_capability=_capability(g.get("compute_capability")),
        )
    return gpus, dict(raw.get("aliases", {}))


def _capability(text: Any) -> tuple[int, int] | None:
    """``"10.0"`` -> (10, 0)."""
    if not text:
        return None
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


def runs_fp8(card: Gpu, recipe: str) -> bool:
    """Whether ``card`` can run the fp8 ``recipe`` (cabe.fp8.card_refusal says why not)."""
    try:
        check_fp8(card, recipe)
    except CabeError:
        return False
    return True


def check_fp8(card: Gpu, recipe: str) -> None:
    """A typed error when ``card`` cannot run the fp8 ``recipe`` (cabe.fp8.card_refusal)."""
    fp8.card_refusal(recipe, card, card.compute_capability)


def all_gpus() -> list[Gpu]:
    """Every card, smallest memory first."""
    return sorted(_catalog()[0].values(), key=lambda g: (g.memory_bytes, g.name))


def gpu(name: str) -> Gpu:
    """Look a card up by name or alias (case-insensitive; spaces and underscores as hyphens)."""
    gpus, aliases = _catalog()
    key = str(name).strip().lower().replace(" ", "-").replace("_", "-")
    for prefix in ("nvidia-", "geforce-"):
        if key.startswith(prefix) and key[len(prefix) :] in gpus.keys() | aliases.keys():
            key = key[len(prefix) :]
    key = aliases.get(key, key)
    if key not in gpus:
        import difflib

        close = difflib.get_close_matches(key, list(gpus) + list(aliases), n=5, cutoff=0.4)
        raise UnknownPresetError("unknown_gpu", "gpu", value=name, suggestions=", ".join(close))
    return gpus[key]


def fit(report: Report, card: Gpu, *, precision: str | None = None) -> dict[str, Any]:
    """Does the run fit on ``card``? Compares reserved memory + context with the card's memory."""
    need = report.reserved_bytes + card.cuda_context_bytes
    margin = card.memory_bytes - need
    out: dict[str, Any] = {
        "gpu": card.name,
        "display": card.display,
        "memory_bytes": card.memory_bytes,
        "usable_bytes": card.usable_bytes,
        "needed_bytes": need,
        "margin_bytes": margin,
        "fits": margin >= 0,
        "utilisation": round(need / card.memory_bytes, 4),
        "bf16": card.bf16,
    }
    if precision is not None and "bf16" in precision and not card.bf16:
        out["warning"] = "no_bf16"
    return out


def fits_table(report: Report, *, precision: str | None = None) -> list[dict[str, Any]]:
    return [fit(report, g, precision=precision) for g in all_gpus()]


def needs_bf16(report: Report) -> bool:
    """Does the reported setup compute in bf16 (cards without bf16 — T4, V100 — cannot run it as is)?"""
    setup = report.setup or {}
    if report.mode != "architecture":
        return False
    if setup.get("method") == "qlora":
        return setup.get("compute_dtype") == "bf16"
    return "bf16" in (setup.get("dtype"), setup.get("autocast"))


def fits_on(report: Report) -> list[str]:
    """Names of the cards the run fits on, smallest first; bf16 setups skip cards without bf16."""
    bf16 = needs_bf16(report)
    recipe = (report.setup or {}).get("fp8") or "none"  # an fp8 run: only the cards that run its recipe
    # a colocated vLLM's pool is a share of the card it was sized on (cabe.objectives.grpo): that card only
    engine = (report.extra.get("grpo") or {}).get("vllm")
    cards = [gpu(engine["gpu"])] if engine else all_gpus()
    return [
        g.name
        for g in cards
        if (g.bf16 or not bf16) and (recipe == "none" or runs_fp8(g, recipe)) and fit(report, g)["fits"]
    ]
