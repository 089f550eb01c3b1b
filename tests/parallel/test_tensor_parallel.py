"""Tensor parallelism as the traced engine cuts it (transformers' TP plan on DTensor: cabe.trace.distributed),
golden numbers with their arithmetic."""

from __future__ import annotations

from cabe import api

KW = dict(model="llama-3.1-8b", method="full", dtype="bf16", autocast="none", batch=1, seq=1024, gpus=8, tp=8)


def test_untied_embedding_gradient_is_whole_under_tp_alone():
    """DTensor's embedding backward has no vocabulary-sharded strategy (torch 2.13 _embedding_ops.py): the .grad of
    the vocab-parallel embedding is a whole partial sum on every GPU. llama-3.1-8b's embedding: 128,256 × 4,096 ×
    2 B = 1,050,673,152 B whole, 131,334,144 B as a TP-8 shard; every other gradient is its weight's shard
    (traced 2026-12-07: +0.21%, sgd-momentum)."""
    r = api.build({**KW, "optimizer": "sgd-momentum"})
    g = r.extra["distributed"]["per_gpu"]
    assert g["gradients_bytes"] - g["weights_bytes"] == 1_050_673_152 - 131_334_144
    assert g["optimizer_bytes"] == g["gradients_bytes"]  # SGD's momentum buffer is clone(grad)


def test_loss_parallel_keeps_the_logits_split():
    """--loss-parallel (the default) keeps the logits over tp GPUs; --no-loss-parallel gathers them whole."""
    split = api.build({**KW, "optimizer": "sgd"})
    whole = api.build({**KW, "optimizer": "sgd", "loss_parallel": False})
    assert whole.total_bytes > split.total_bytes


def test_hsdp_shards_within_a_node_over_tp():
    """HSDP with TP: a node of 8 GPUs holds 2 TP groups of 4, so each shard group is 2 GPUs (not 8)."""
    r = api.build({**KW, "optimizer": "adamw", "gpus": 16, "tp": 4, "shard": "fsdp-hybrid", "gpus_per_node": 8})
    assert r.extra["distributed"]["shard_group"] == 2
