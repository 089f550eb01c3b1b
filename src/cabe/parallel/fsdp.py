"""PyTorch FSDP (FSDP1 ``FULL_SHARD`` / ``HYBRID_SHARD``, FSDP2 ``fully_shard``): parameters,
gradients and optimizer state sharded over the group; one wrapped unit (a decoder layer) gathered
while it runs (two with backward prefetch), the root unit (embeddings, final norm, lm_head) kept
gathered; ``CPUOffload(offload_params=True)`` moves parameters and gradients to the host and steps
the optimizer there."""

from __future__ import annotations

from cabe.parallel.strategy import Context, States


def states(c: Context) -> States:
    mine, dt = c.mine, c.dt
    # MixedPrecision casts the all-gathered parameters: no autocast weight cache
    unit_b = 2 if c.amp else (dt.weight if dt.weight else 2)
    layer_gathered = mine.layer_elements * unit_b + mine.layer_quantized * c.scale.weights
    root_gathered = mine.root_elements * unit_b
    units = 2 if c.cfg.fsdp_prefetch else 1
    out = States(
        weights=mine.stored_sharded * c.scale.weights + mine.quantized_sharded * c.scale.weights,
        grads=c.grads * c.sharded_fraction if mine.trainable else 0.0,
        optimizer=c.optimizer * c.sharded_fraction if mine.trainable else 0.0,
        temporaries=c.temporaries * c.sharded_fraction if mine.trainable else 0.0,
        keep_copies=False,
    )
    out.buffers["forward"]["gathered_params"] = units * layer_gathered + root_gathered
    out.buffers["backward"]["gathered_params"] = units * layer_gathered + root_gathered
    layer_grad = mine.layer_trainable_elements * unit_b
    if layer_grad:
        out.buffers["backward"]["unsharded_grads"] = layer_grad
    if c.offload_parameters:
        out.host += out.weights + out.grads + out.optimizer
        out.weights = out.grads = out.optimizer = out.temporaries = 0.0
        out.notes.append("fsdp_cpu_offload")
    if c.layout.strategy == "fsdp-hybrid":
        out.notes.append("hybrid_replicates_across_nodes")
    return out
