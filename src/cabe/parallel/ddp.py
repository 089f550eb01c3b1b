"""PyTorch DDP (``torch/nn/parallel/distributed.py``): every rank keeps everything; the Reducer's flat
buckets cover every gradient, a second copy unless ``gradient_as_bucket_view=True``."""

from __future__ import annotations

from cabe.parallel.strategy import Context, States, unsharded


def states(c: Context) -> States:
    out = unsharded(c)
    if not c.cfg.gradient_as_bucket_view and c.grads:
        out.everywhere("ddp_buckets", c.grads)
        out.notes.append("ddp_bucket_copy")
    return out
