"""A traced ``from_pretrained`` load of a small Llama against cabe's loading model (cabe.parallel.loading).

Saves a Llama (bf16, several safetensors shards through ``save_pretrained(max_shard_size=...)``) to a temporary
directory, then loads it in ``--procs`` processes at once (each its own ``from_pretrained``, as DDP / ZeRO-1/2 /
FSDP ranks do), and measures on each process, while every process holds its loaded model:

* exactly, from the parameters themselves: each parameter's storage is either inside a mapping of one of the
  checkpoint's files (``/proc/self/maps``: a view of the page cache) or private memory; their bytes;
* independently, from the kernel (``/proc/self/smaps_rollup``): the growth of ``Anonymous`` (private pages) over
  the load, and the growth of ``Pss_File`` (the file pages the process maps, each page shared by k processes counted 1/k).

``--fsdp`` sets what ``accelerate launch`` sets for FSDP with ``cpu_ram_efficient_loading`` (``ACCELERATE_USE_FSDP``,
``FSDP_CPU_RAM_EFFICIENT_LOADING``, ``LOCAL_RANK``) and starts a gloo process group, so transformers' FSDP branch
runs: under transformers 5.25 the ranks other than 0 load as much as rank 0 (transformers issue #43749).

Then it prints cabe's figures for the same model and setup (``shard`` ddp or fsdp, ``gpus = gpus_per_node =
procs``). CPU only; no GPU path (device_map, zero.Init) is traced here.

    PYTHONPATH=src .venv/bin/python benchmarks/loading/traced.py --dtype fp32 --procs 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

#: a Llama whose weights dominate the processes' own memory: 2 × 16,384 × 512 (embeddings, lm_head) + 4 layers
SMALL = dict(
    hidden_size=512,
    intermediate_size=1376,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    vocab_size=16384,
    tie_word_embeddings=False,
)
#: the suite's: a few MB, loads in well under a second
TINY = dict(
    hidden_size=64,
    intermediate_size=172,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1024,
    tie_word_embeddings=False,
)
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def save(directory: str, config: dict[str, Any], shard: str = "4MB") -> dict[str, Any]:
    """A randomly initialised bf16 Llama saved in ``directory`` in safetensors shards of at most ``shard``;
    returns its config as a dict."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**config, dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(directory, max_shard_size=shard)
    return cfg.to_dict()


def _rollup() -> dict[str, int]:
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def _mapped_ranges(suffix: str = ".safetensors") -> list[tuple[int, int]]:
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith(suffix):
                lo, hi = line.split()[0].split("-")
                ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


def classify(model: Any) -> dict[str, int]:
    """The parameters' storages, each once: bytes inside a mapped checkpoint file, bytes in private memory."""
    ranges = _mapped_ranges()
    seen: set[int] = set()
    mapped = private = 0
    for p in model.parameters():
        s = p.untyped_storage()
        ptr = s.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        if any(lo <= ptr < hi for lo, hi in ranges):
            mapped += s.nbytes()
        else:
            private += s.nbytes()
    return {"mapped_bytes": mapped, "private_bytes": private}


def load_once(directory: str, dtype: str) -> dict[str, int]:
    """One ``from_pretrained`` in this process: what its parameters hold, and the kernel's view of the load."""
    import torch
    from transformers import AutoModelForCausalLM

    before = _rollup()
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, TORCH_DTYPES[dtype]))
    after = _rollup()
    out = classify(model)
    out["anonymous_growth_bytes"] = after["Anonymous"] - before["Anonymous"]
    out["pss_file_before_bytes"] = before.get("Pss_File", 0)
    out["model"] = model  # type: ignore[assignment]
    return out


def _rank(rank: int, procs: int, directory: str, dtype: str, fsdp: bool, store: str, q: Any, barrier: Any) -> None:
    if fsdp:
        import torch.distributed as dist

        os.environ.update(
            ACCELERATE_USE_FSDP="true", FSDP_CPU_RAM_EFFICIENT_LOADING="true", LOCAL_RANK=str(rank), RANK=str(rank)
        )
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=procs)
    barrier.wait()
    r = load_once(directory, dtype)
    model = r.pop("model")
    barrier.wait()  # every process holds its model: the node's moment
    r["pss_file_bytes"] = _rollup().get("Pss_File", 0) - r.pop("pss_file_before_bytes")
    r["rank"] = rank
    q.put(r)
    barrier.wait()
    del model


def trace(directory: str, dtype: str, procs: int = 1, fsdp: bool = False) -> list[dict[str, int]]:
    """Load ``directory`` in ``procs`` processes at once; one dict per process (:func:`load_once`'s figures, and
    ``pss_file_bytes`` while all of them hold their model)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    barrier = ctx.Barrier(procs)
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "store")
        ps = [
            ctx.Process(target=_rank, args=(r, procs, directory, dtype, fsdp, store, q, barrier)) for r in range(procs)
        ]
        for p in ps:
            p.start()
        out = [q.get(timeout=300) for _ in ps]
        for p in ps:
            p.join(timeout=60)
    return sorted(out, key=lambda r: r["rank"])


def modelled(config: dict[str, Any], dtype: str, procs: int, fsdp: bool) -> dict[str, Any]:
    """cabe's figures for the same model and setup."""
    from cabe.analytic import estimate_model
    from cabe.families import from_config
    from cabe.training import TrainingSetup

    spec = from_config(config, name="traced-llama")
    setup = TrainingSetup(
        dtype=dtype, gpus=max(2, procs), gpus_per_node=max(2, procs), shard="fsdp" if fsdp else "ddp", batch=1, seq=8
    )
    d = estimate_model(spec, setup).extra["distributed"]
    per_node = max(2, procs)
    return {
        "path": d["load_path"],
        "private_per_process_bytes": d["host_ram_load_peak_bytes_per_node"] // per_node,
        "page_cache_bytes_per_node": d["host_page_cache_load_bytes_per_node"],
        "spec_dtype": spec.dtype,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=tuple(TORCH_DTYPES), default="fp32", help="from_pretrained's dtype")
    ap.add_argument("--procs", type=int, default=2, help="processes loading at once (a node's ranks)")
    ap.add_argument("--fsdp", action="store_true", help="accelerate's FSDP cpu_ram_efficient_loading environment")
    ap.add_argument("--tiny", action="store_true", help="the suite's tiny model")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        config = save(d, TINY if a.tiny else SMALL)
        files = sorted(p.name for p in Path(d).glob("*.safetensors"))
        file_bytes = sum((Path(d) / f).stat().st_size for f in files)
        ranks = trace(d, a.dtype, a.procs, a.fsdp)
    m = modelled(config, a.dtype, a.procs, a.fsdp)
    report = {"files": len(files), "file_bytes": file_bytes, "ranks": ranks, "modelled": m}
    if a.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"checkpoint: {len(files)} safetensors files, {file_bytes:,} B (bf16); from_pretrained(dtype={a.dtype})")
    print(f"cabe: path {m['path']}, private {m['private_per_process_bytes']:,} B per process, ", end="")
    print(f"page cache {m['page_cache_bytes_per_node']:,} B per node")
    total_private = sum(r["private_bytes"] for r in ranks)
    total_pss = sum(r["pss_file_bytes"] for r in ranks)
    for r in ranks:
        print(
            f"rank {r['rank']}: parameters private {r['private_bytes']:,} B, mapped {r['mapped_bytes']:,} B; "
            f"Anonymous +{r['anonymous_growth_bytes']:,} B; Pss_File +{r['pss_file_bytes']:,} B"
        )
    print(
        f"node ({a.procs} processes): private {total_private:,} B (cabe {a.procs * m['private_per_process_bytes']:,}"
        f" B); Pss_File growth summed {total_pss:,} B (the file pages touched, each counted once per node)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
