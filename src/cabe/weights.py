"""The weights of a served model, by the format they are stored in.

Weight formats (bytes per weight of the quantized matrices; embeddings, norms, biases, routers and
lm_head stay 16-bit except in GGUF, whose bits per weight are llama.cpp's whole-file averages):

* ``auto`` (the default): as the checkpoint ships, :func:`shipped_format` (its ``quantization_config``, else its
  dtype, else fp16);
* ``fp32`` 4, ``fp16`` / ``bf16`` 2, ``fp8`` 1 (+ one fp32 scale per matrix);
* ``int8`` (bitsandbytes LLM.int8): 1 + an fp32 scale per output row;
* ``nf4`` / ``fp4`` (bitsandbytes 4-bit, double quantization): :func:`cabe.parameters.quantized_bytes`,
  ≈ 0.516 B; only ``nn.Linear`` modules are replaced (lm_head kept);
* ``gptq-Nbit`` / ``awq-Nbit`` with group size g (default 128): N/8 B + per group of g input
  weights one fp16 scale and one N-bit zero: N/8 + (2 + N/8)/g;
* ``mxfp4`` (gpt-oss as shipped): the MoE experts' 3-D matrices in OCP MX FP4, 4-bit e2m1 values in blocks
  of 32 with one uint8 e8m0 scale per block, 0.5 + 1/32 B per weight (transformers 5.24,
  integrations/mxfp4.py: ``*_blocks`` (…, 16) uint8 and ``*_scales`` uint8 per 32 values); attention, routers,
  biases, embeddings and lm_head stay 16-bit (the checkpoints' ``modules_to_not_convert``). A model without
  experts has nothing in MXFP4. Kept packed only with the triton kernels on a GPU; without them transformers
  dequantizes to bf16 at load (then ``bf16`` is the right format);
* ``gguf-<type>``: bits per weight Q8_0 8.5, Q6_K 6.5625, Q5_K_M ≈ 5.69, Q5_K_S 5.52, Q5_0 5.5,
  Q4_K_M ≈ 4.85, Q4_K_S ≈ 4.58, Q4_0 4.5, Q3_K_L ≈ 4.27, Q3_K_M ≈ 3.91, Q3_K_S ≈ 3.5, Q2_K ≈ 2.63
  (block layouts in ggml-common.h; K-quant "mixes" averaged as llama.cpp's quantize reports them).
"""

from __future__ import annotations

from typing import Any

from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.layers import Linear
from cabe.parameters import quantized_bytes

GGUF_BPW: dict[str, float] = {
    "q8_0": 8.5,
    "q6_k": 6.5625,
    "q5_k_m": 5.69,
    "q5_k_s": 5.52,
    "q5_0": 5.5,
    "q5_1": 6.0,
    "q4_k_m": 4.85,
    "q4_k_s": 4.58,
    "q4_0": 4.5,
    "q4_1": 5.0,
    "q3_k_l": 4.27,
    "q3_k_m": 3.91,
    "q3_k_s": 3.5,
    "q2_k": 2.63,
    "f16": 16.0,
    "bf16": 16.0,
}
PLAIN = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0}
FORMATS = (
    ("auto",)
    + tuple(PLAIN)
    + ("fp8", "int8", "nf4", "fp4", "mxfp4", "gptq-4bit", "gptq-8bit", "gptq-3bit", "gptq-2bit", "awq-4bit")
    + tuple("gguf-" + k for k in GGUF_BPW)
)


def _check_format(fmt: str) -> str:
    f = str(fmt).strip().lower()
    if f not in FORMATS:
        raise InvalidValueError("bad_choice", "weights", value=fmt, allowed=", ".join(FORMATS))
    return f


def shipped_format(spec: ModelSpec) -> str:
    """``--weights auto``: the model served as its checkpoint ships (vLLM and transformers load gpt-oss's MXFP4
    experts and DeepSeek-V3's fp8 weights as they are on a GPU with the kernels): the checkpoint's quantization,
    else its dtype, else fp16."""
    return spec.weights_format if spec.weights_format in FORMATS else "fp16"


def weights_bytes(spec: ModelSpec, fmt: str = "auto", group_size: int = 128) -> dict[str, Any]:
    """Bytes of the weights in a format: ``{"total_bytes", "quantized_params", "other_params", "bytes_per_weight"}``
    (``format``: the one counted, ``auto`` resolved; ``shipped``: whether it is the checkpoint's own)."""
    f = _check_format(fmt)
    shipped = f == "auto"
    if shipped:
        f = shipped_format(spec)
    out = _weights_bytes(spec, f, group_size)
    out["shipped"] = shipped
    return out


def _weights_bytes(spec: ModelSpec, f: str, group_size: int) -> dict[str, Any]:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise InvalidValueError("out_of_range", "group_size", value=group_size, minimum=1, maximum=1 << 20)
    n = spec.parameter_count
    if f.startswith("gguf-"):
        bpw = GGUF_BPW[f[5:]]
        return {
            "total_bytes": round(n * bpw / 8),
            "quantized_params": n,
            "other_params": 0,
            "bytes_per_weight": bpw / 8,
            "format": f,
        }
    if f in PLAIN:
        return {
            "total_bytes": round(n * PLAIN[f]),
            "quantized_params": 0,
            "other_params": n,
            "bytes_per_weight": PLAIN[f],
            "format": f,
        }
    q: float = 0
    qn = 0
    for run in spec.runs:  # summed over the runs of like layers
        run_q, run_qn = _quantized_layer(run.linears, f, group_size)
        q += run_q * run.count
        qn += run_qn * run.count
    other = n - qn
    total = round(q + 2 * other)
    return {
        "total_bytes": total,
        "quantized_params": qn,
        "other_params": other,
        "bytes_per_weight": round(q / qn, 5) if qn else 0,
        "format": f,
    }


#: MXFP4: 32 values per block, 4 bits each, and one uint8 (e8m0) scale per block
MXFP4_BLOCK = 32


def _mxfp4_layer(linears: tuple[Linear, ...]) -> tuple[float, int]:
    """(bytes, elements) of one layer's MoE expert matrices in MXFP4: 0.5 B per weight and 1 B per block of 32."""
    numel = [lin.in_features * lin.out_features * lin.copies for lin in linears if lin.slot == "experts"]
    return sum(n / 2 + n / MXFP4_BLOCK for n in numel), sum(numel)


def _quantized_layer(linears: tuple[Linear, ...], f: str, group_size: int) -> tuple[float, int]:
    """(bytes, elements) of one layer's weight matrices stored in the quantized format ``f``."""
    if f in ("nf4", "fp4"):
        q4 = [lin.in_features * lin.out_features * lin.copies for lin in linears if lin.is_module]
        return sum(quantized_bytes(numel, True) for numel in q4), sum(q4)
    if f == "mxfp4":
        return _mxfp4_layer(linears)
    mats = [
        (lin.in_features * lin.out_features * lin.copies, lin.out_features * lin.copies, lin.in_features)
        for lin in linears
        if lin.role != "router"
    ]
    q: float
    if f == "fp8":
        q = sum(numel + 4 for numel, *_ in mats)
    elif f == "int8":
        q = sum(numel + 4 * rows for numel, rows, _ in mats)
    else:  # gptq / awq
        bits = int(f.split("-")[1].removesuffix("bit"))
        q = 0.0
        for numel, _rows, inf in mats:
            groups = numel / group_size
            q += numel * bits / 8 + groups * (2 + bits / 8)
            if f.startswith("gptq"):
                q += 4 * inf  # g_idx: one int32 per input feature
    return q, sum(m[0] for m in mats)
