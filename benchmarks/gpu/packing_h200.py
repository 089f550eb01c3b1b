"""Packed and padding-free batches on a real GPU (issue 11): qwen2.5-0.5b, LoRA r8 (PEFT's default targets), bf16
weights under bf16 autocast, AdamW (foreach), batch 4 × seq 1024, SDPA; padded rows, packed rows (4 documents
each, position_ids restarting per document) and one padding-free row of 4 × 1024 tokens. The peak of the second
step (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` at its start), the figure
``cabe estimate`` and ``cabe trace`` give. Run from the repository root on a CUDA machine; results in
benchmarks/gpu/results/packing-h200.md."""

import json

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

B, S = 4, 1024


def batch(mode: str, vocab: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    if mode == "padding-free":
        return torch.randint(0, vocab, (1, B * S), device="cuda"), (torch.arange(B * S, device="cuda") % S)[None]
    ids = torch.randint(0, vocab, (B, S), device="cuda")
    return ids, None if mode == "none" else (torch.arange(S, device="cuda") % (S // 4))[None].expand(B, S)


def main() -> None:
    with open("src/cabe/data/models/qwen2.5-0.5b.json", encoding="utf-8") as fh:
        raw = json.load(fh)
    raw.pop("_cabe", None)
    cfg = AutoConfig.for_model(**raw)
    for mode in ("none", "packed", "padding-free"):
        torch.cuda.empty_cache()
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM"))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        for step in range(2):
            if step == 1:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            ids, pos = batch(mode, cfg.vocab_size)
            kw = {} if pos is None else {"position_ids": pos}
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids.clone(), use_cache=False, **kw).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss, ids, pos
        torch.cuda.synchronize()
        print(mode, torch.cuda.max_memory_allocated(), flush=True)
        del model, opt


if __name__ == "__main__":
    main()
