"""mamba-ssm's fused Mamba-2 training kernel on a real GPU, against what cabe.ssm models from its source.

    pip install mamba-ssm causal-conv1d      # on a CUDA machine (they compile or fetch CUDA wheels)
    PYTHONPATH=src python benchmarks/gpu/mamba2_kernel.py [--json FILE]

For the Mamba-2 mixers of Granite-4.0-H (1B / Tiny: 48 heads of 64, state 128; Small: 128 heads of 64), one call of
``mamba_split_conv1d_scan_combined`` as transformers 5.24 makes it in training (``norm_before_gate=False``, the
gated norm's and out_proj's weights passed in), bf16, on random data: the bytes it keeps for backward beyond its
input and output, its forward peak and its backward peak, each against cabe's figure (cabe.ssm: the saved y and
rstd, ``forward_workspace``, ``backward_workspace``). Not run in CI: it needs the CUDA packages. Not yet run
(issue 13, the Mamba-2 part): the session that wrote it had no way to send this branch to the GPU it was lent.
"""

from __future__ import annotations

import argparse
import json

import torch

from cabe.activations.mamba import backward_workspace, forward_workspace
from cabe.families import from_config
from cabe.mixers import Mamba2
from cabe.models import preset

CASES = [("granite-4.0-h-1b", 1, 4096), ("granite-4.0-h-1b", 2, 2048), ("granite-4.0-h-small", 1, 4096)]


def one(name: str, b: int, s: int) -> dict[str, object]:
    from mamba_ssm.ops.triton.ssd_combined import mamba_split_conv1d_scan_combined

    spec = from_config(dict(preset(name).config))
    m: Mamba2 = spec.mamba2
    h, dev, bf = spec.hidden_size, torch.device("cuda"), torch.bfloat16
    w = dict(device=dev, dtype=bf, requires_grad=True)
    zxbcdt = torch.randn(b, s, m.in_proj_width, **w)
    conv_w, conv_b = torch.randn(m.conv_dim, m.conv_kernel, **w), torch.randn(m.conv_dim, **w)
    dt_bias, d = torch.randn(m.heads, **w), torch.randn(m.heads, **w)
    a = -torch.rand(m.heads, device=dev, dtype=torch.float32)
    norm_w, out_w = torch.randn(m.d_inner, **w), torch.randn(h, m.d_inner, **w) / 64
    torch.cuda.synchronize()
    m0 = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = mamba_split_conv1d_scan_combined(
        zxbcdt, conv_w, conv_b, dt_bias, a, d, m.chunk, activation="silu", rmsnorm_weight=norm_w, rmsnorm_eps=1e-5,
        outproj_weight=out_w, outproj_bias=None, headdim=m.head_dim, ngroups=m.groups, norm_before_gate=False,
    )  # fmt: skip
    torch.cuda.synchronize()
    m1, p_fwd = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    dout = torch.randn_like(out)
    torch.cuda.synchronize()
    m2 = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out.backward(dout)
    torch.cuda.synchronize()
    p_bwd = torch.cuda.max_memory_allocated()
    tokens, x, out_bytes = b * s, 2, out.numel() * out.element_size()
    saved_cabe = tokens * (x * m.d_inner + 4 * m.groups)  # y and rstd (zxbcdt is the input, kept by the caller)
    return {
        "model": name,
        "batch": b,
        "seq": s,
        "saved_measured": m1 - m0 - out_bytes,
        "saved_cabe": saved_cabe,
        # the forward's largest moment beyond its input: cabe's workspace includes out_proj's result
        "forward_peak_measured": p_fwd - m0,
        "forward_peak_cabe": saved_cabe + tokens * forward_workspace(spec, s, x, 2),
        # the backward's largest moment beyond what it started with (saved tensors, output, dout)
        "backward_peak_measured": p_bwd - m2,
        "backward_peak_cabe": tokens * backward_workspace(spec, s, x, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    rows = [one(*c) for c in CASES]
    for r in rows:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
