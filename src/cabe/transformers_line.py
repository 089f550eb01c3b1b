"""Which transformers a run uses, and what differs between its two lines (4.x and 5.x) that changes memory.

A request names the line with ``transformers`` (``"4"``, ``"5"`` or a version such as ``"4.51.3"``); not given, it
is the installed transformers' line, or 5 where none is installed (the analytic path never imports it:
``importlib.metadata`` reads its version). Each behaviour that differs is one function or table here, cited to both
sources (transformers 4.57.6, the last 4.x, and 5.24.0):

* **MoE experts' layout** (:func:`as_line`). 4.x builds every routed expert as its own ``nn.Linear`` modules
  (models/mixtral/modeling_mixtral.py:57-70 ``MixtralBlockSparseTop2MLP`` w1 / w3 / w2,
  models/qwen3_moe/modeling_qwen3_moe.py:222 ``nn.ModuleList`` of ``Qwen3MoeMLP``, the same in qwen2_moe,
  qwen3_next and deepseek_v3) and most routers as an ``nn.Linear`` (``self.gate = nn.Linear(...)``,
  modeling_mixtral.py:95): bitsandbytes' ``replace_with_bnb_linear`` quantizes them under QLoRA (the modules not
  converted are the output embedding only, quantizers/base.py:293-312 ``get_keys_to_not_convert``) and PEFT adapts
  them by name or under ``all-linear``. 5.x fuses the experts into 3-D parameters (``gate_up_proj``, ``down_proj``)
  that bitsandbytes leaves in 16 bits and PEFT reaches only through ``target_parameters``.
  gpt-oss, Llama 4, Qwen3-VL-MoE's experts and Granite's ParallelExperts are 3-D parameters in both lines.
* **The default load dtype** (:func:`default_dtype`): ``from_pretrained`` without ``dtype`` loads fp32 in 4.x
  (modeling_utils.py 4.57.6 ``_get_dtype``: "set fp32 as the default dtype for BC"), fp16 when bitsandbytes
  quantizes (quantizers/quantizer_bnb_4bit.py:244-255 ``update_dtype``), and the checkpoint's (``"auto"``) in 5.x
  (modeling_utils.py 5.24 ``from_pretrained``: ``dtype`` defaults to ``"auto"``).
* **Checkpointing** (:func:`reentrant_checkpointing`): ``gradient_checkpointing_enable()`` without kwargs is
  reentrant in 4.x (modeling_utils.py 4.57.6:3691-3692 ``{"use_reentrant": True}``), non-reentrant in 5.x
  (modeling_utils.py 5.24:3157-3158); 4.x has neither ``every_n_layers`` nor ``offload`` and makes the inputs
  require grad only for a PEFT model (4.57.6:3714, ``_hf_peft_config_loaded``), 5.x for every text model
  (5.24:3189-3197).
* **Attention**: Gemma 2 runs SDPA in 4.x (``_supports_sdpa = True``, models/gemma2/modeling_gemma2.py 4.57.6:346)
  and eager in 5.x (``_supports_sdpa = False``, 5.24:353); BERT and Qwen3-Next have no flash_attention_2 in 4.x
  (:data:`NO_FLASH_4`). Every other family cabe reads declares the same SDPA and flash support in both.
* **PEFT's default targets** are PEFT's, by model type, whatever transformers runs; on a 5.x MoE model PEFT moves
  the v4 expert names onto the fused parameters (``ModelSpec.peft_parameter_targets``), which 4.x has no need of.
* **The loss** is the same in both lines from 4.46 on: ``ForCausalLMLoss`` upcasts the logits to fp32 and
  ``fixed_cross_entropy`` divides by ``num_items_in_batch`` (loss/loss_utils.py 4.57.6:28-68 and 5.24:34-73, line
  for line); before 4.46 the model upcast and shifted its own logits, which cabe does not model
  (:data:`OLDEST`).
* **Model types**: those 4.57.6 has no configuration for (:data:`ABSENT_IN_4`) are refused under 4.x.
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING

from cabe.errors import InvalidValueError

if TYPE_CHECKING:
    from cabe.architecture import ModelSpec
    from cabe.layers import Linear

#: the oldest 4.x cabe models: ``loss_function`` / ``ForCausalLMLoss`` arrived in 4.46
OLDEST = (4, 46)
#: the newest line cabe knows
NEWEST_MAJOR = 5
#: model types cabe reads that transformers 4.57.6, the last 4.x, has no configuration for
#: (models/auto/configuration_auto.py 4.57.6, ``CONFIG_MAPPING_NAMES``)
ABSENT_IN_4 = frozenset({"deepseek_v32", "deepseek_v4", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text"})

#: 4.x: the nn.Linear modules a routed expert is made of, by the 5.x fused stack they became, per model type
#: (mixtral: modeling_mixtral.py 4.57.6:57-70; qwen2_moe / qwen3_moe / qwen3_next / deepseek_v3: each expert a
#: gated MLP with gate_proj, up_proj, down_proj, e.g. modeling_qwen3_moe.py 4.57.6:222-224)
_QWEN_EXPERT = {"experts.gate_up_proj": ("gate_proj", "up_proj"), "experts.down_proj": ("down_proj",)}
EXPERT_MODULES_4: dict[str, dict[str, tuple[str, ...]]] = {
    "mixtral": {"experts.gate_up_proj": ("w1", "w3"), "experts.down_proj": ("w2",)},
    "qwen2_moe": _QWEN_EXPERT,
    "qwen3_moe": _QWEN_EXPERT,
    "qwen3_next": _QWEN_EXPERT,
    "deepseek_v3": _QWEN_EXPERT,
}
#: 4.x: model types whose router is an ``nn.Linear`` named ``gate`` (modeling_mixtral.py 4.57.6:95,
#: modeling_qwen2_moe.py:597, modeling_qwen3_moe.py:221, modeling_qwen3_next.py:802, modeling_qwen3_vl_moe.py:135);
#: DeepSeek-V3's ``DeepseekV3TopkRouter`` (modeling_deepseek_v3.py 4.57.6:120) and gpt-oss's / Llama 4's are bare
#: parameters in both lines
ROUTER_MODULE_4 = frozenset({"mixtral", "qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_vl_moe"})

#: a line or a PEP 440 release: 4, 4.51, 4.51.3, 5.0.0rc1, 4.57.0.dev0, 4.46.3+local
#: 4.x: model types whose classes do not set ``_supports_flash_attn`` (False by default): ``from_pretrained`` refuses
#: flash_attention_2 there (models/bert/modeling_bert.py, models/qwen3_next/modeling_qwen3_next.py 4.57.6; 5.24
#: sets it True)
NO_FLASH_4 = frozenset({"bert", "qwen3_next"})

_VERSION = re.compile(r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?((?:a|b|rc|\.post|\.dev)\d+)?(\+[a-z0-9.]+)?$")


def parse(value: object) -> str:
    """A request's ``transformers``: ``"4"``, ``"5"`` or a version string (``"4.51.3"``, ``"5.25.0"``), returned
    as given but stripped; a typed error for anything else, a 4.x older than :data:`OLDEST` or a major line cabe
    does not know."""
    # (an integer of 10**5000 is no version, and str() of it raises: refused before it is written)
    readable = isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 100)
    text = str(value).strip().lower().removeprefix("v") if readable else ""
    m = _VERSION.match(text) if readable else None
    if m is None:
        raise InvalidValueError("transformers_version", "transformers", value=value)
    major, minor = int(m.group(1)), int(m.group(2) or 0)
    if major < OLDEST[0] or major > NEWEST_MAJOR or (major == OLDEST[0] and m.group(2) and minor < OLDEST[1]):
        raise InvalidValueError("transformers_unsupported", "transformers", value=value, oldest="4.46")
    return text


#: the newest release of each line cabe models: what a bare line ("4", "5") means
NEWEST_RELEASE = {4: (4, 57), 5: (5, 25)}
#: transformers 5.25 rewrote Falcon's attention onto the shared kernels (models/falcon/modeling_falcon.py 5.25.0:
#: 297-331: q, k and v split views of the fused projection, ``ALL_ATTENTION_FUNCTIONS``, the generic
#: ``eager_attention_forward`` with ``repeat_kv`` and an fp32 softmax cast back); before, ``_split_heads`` indexed
#: k and v into copies and its eager softmax ran in the LayerNorm output's dtype (5.24.0:260-330)
FALCON_SHARED_ATTENTION = (5, 25)


def release(value: str | None) -> tuple[int, int]:
    """(major, minor) of a request's transformers (the installed one's when None); a bare line is the newest
    release of it cabe models (:data:`NEWEST_RELEASE`)."""
    text = value if value is not None else resolved_version()
    parts = text.split(".")
    line = int(parts[0])
    if len(parts) < 2:
        return NEWEST_RELEASE.get(line, (line, 0))
    return line, int(re.match(r"\d+", parts[1]).group(0))  # type: ignore[union-attr]


def major(value: str | None) -> int:
    """The line (4 or 5) of a request's ``transformers``, or of the installed one when None."""
    text = value if value is not None else installed_line()
    return int(text.split(".", 1)[0])


@lru_cache(maxsize=1)
def installed() -> str | None:
    """The installed transformers' version, or None: from the name of its ``transformers-<version>.dist-info``
    folder on ``sys.path`` (PEP 376/427; no import of transformers, and not importlib.metadata's 50 ms, which the
    CLI's 0.3 s cannot spare), else importlib.metadata where a ``transformers`` package is there without one."""
    import os
    import sys

    package = False
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            m = _DIST_INFO.match(name)
            if m is not None:
                return m.group(1)
            package = package or name == "transformers"
    if not package:
        return None
    from importlib import metadata

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


_DIST_INFO = re.compile(r"^transformers-(\d[^-]*?)(?:-py[\d.]+)?\.(?:dist|egg)-info$")


def installed_line() -> str:
    """``"4"`` or ``"5"``: the installed transformers' line, 5 where none is installed or it is outside 4-5."""
    version = installed()
    line = version.split(".", 1)[0] if version else ""
    return line if line in ("4", "5") else "5"


def resolved_version() -> str:
    """What a request that names no transformers runs: the installed version, else ``"5"``."""
    version = installed()
    return version if version and version.split(".", 1)[0] in ("4", "5") else "5"


def check_traceable(value: str | None) -> None:
    """The trace runs the installed transformers: a request naming the other line cannot be traced here."""
    version = installed()
    if value is None or version is None:
        return
    if major(value) != int(version.split(".", 1)[0]):
        raise InvalidValueError("trace_transformers_line", "transformers", value=value, installed=version)


def default_dtype(line: int, method: str) -> str:
    """What ``from_pretrained`` loads the weights in when it gets no ``dtype`` (see the module's sources):
    ``auto`` (the checkpoint's) in 5.x; fp32 in 4.x, fp16 when bitsandbytes quantizes."""
    if line >= 5:
        return "auto"
    return "fp16" if method == "qlora" else "fp32"


def reentrant_checkpointing(line: int) -> bool:
    """``gradient_checkpointing_enable()``'s default ``use_reentrant`` (see the module's sources)."""
    return line < 5


def check_model_type(model_type: str, line: int, value: str | None) -> None:
    """Refuse a model type the requested line has no code for."""
    if line < 5 and model_type in ABSENT_IN_4:
        raise InvalidValueError(
            "transformers_no_model_type", "transformers", value=value or installed_line(), model_type=model_type
        )


def as_line(spec: ModelSpec, line: int, value: str | None = None) -> ModelSpec:
    """The model as the transformers a request names (``line``, and ``value``: the request's ``transformers``)
    builds it: for 4, routed experts and routers as ``nn.Linear`` modules where 4.x has them
    (:data:`EXPERT_MODULES_4`, :data:`ROUTER_MODULE_4`), nothing moved onto bare parameters by PEFT (its v4 -> v5
    conversion runs only on a 5.x model), and Gemma 2's SDPA; before 5.25, Falcon's own attention
    (:data:`FALCON_SHARED_ATTENTION`); otherwise unchanged."""
    if line < 5:
        return _falcon_own(_as_4(spec)) if spec.model_type == "falcon" else _as_4(spec)
    if spec.model_type == "falcon" and release(value) < FALCON_SHARED_ATTENTION:
        return _falcon_own(spec)
    return spec  # (no lookup on the common path: hashing a whole spec costs microseconds)


@lru_cache(maxsize=64)
def _falcon_own(spec: ModelSpec) -> ModelSpec:
    """Falcon before 5.25 (models/falcon/modeling_falcon.py 5.24.0; 4.57.6 alike): ``_split_heads`` slices the
    classic layout's fused output (views) but indexes multi-query and new-architecture k and v with
    ``[..., [-1], :]`` (copies); the eager path runs ``F.softmax(scores + mask, dtype=hidden_states.dtype)`` (the
    LayerNorm output's dtype, no fp32 cast back) on the broadcast single key; SDPA gets the broadcast key and
    value, so PyTorch runs its math kernel for multi-query."""
    classic = spec.num_kv_heads == spec.num_heads  # (multi-query: one kv head; the new architecture: num_kv_heads)
    return replace(
        spec,
        value_is_qkv_view=classic,
        eager_softmax_fp32=False,
        sdpa_fallback="math" if spec.num_kv_heads == 1 else "",
    )


@lru_cache(maxsize=256)
def _as_4(spec: ModelSpec) -> ModelSpec:
    experts = EXPERT_MODULES_4.get(spec.model_type, {})
    router = spec.model_type in ROUTER_MODULE_4
    if not (experts or router or spec.peft_parameter_targets) and spec.model_type not in NO_FLASH_4 | {"gemma2"}:
        return spec

    def v4(lin: Linear) -> tuple[Linear, ...]:
        if lin.role == "expert" and lin.name in experts:
            names = experts[lin.name]
            # one nn.Linear per expert and name: the fused output splits evenly (gate and up)
            out = lin.out_features // len(names)
            return tuple(replace(lin, name=n, out_features=out, is_module=True) for n in names)
        if lin.role == "router" and router:
            return (replace(lin, name="gate", is_module=True),)
        return (lin,)

    groups = tuple(replace(g, linears=tuple(new for lin in g.linears for new in v4(lin))) for g in spec.layer_groups)
    return replace(
        spec,
        layer_groups=groups,
        peft_parameter_targets=(),
        sdpa_fallback="" if spec.model_type == "gemma2" else spec.sdpa_fallback,
        flash_attention=spec.flash_attention and spec.model_type not in NO_FLASH_4,
        # (Qwen3-VL-MoE: a 5.x TopKRouter PEFT refuses to wrap is an nn.Linear ``gate`` it adapts on 4.x)
        lora_unsupported=tuple(n for n in spec.lora_unsupported if not (router and n == "gate")),
    )
