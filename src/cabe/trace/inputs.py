"""What a traced step runs with besides the model: the optimizer (:func:`make_optimizer`), the batch
(:func:`make_inputs`, packed rows' position_ids) and autocast (:func:`autocast`). Torch is imported inside the
functions."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from cabe import optimizer
from cabe.errors import ConfigError
from cabe.training import TrainingSetup


def autocast_dtype(setup: TrainingSetup) -> Any:
    """The dtype ``torch.autocast`` runs the forward in (the Trainer's ``bf16`` / ``fp16``), or None."""
    import torch

    if setup.autocast == "none":
        return None
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[setup.autocast]


# ---- the optimizer ----------------------------------------------------------------------------
def make_optimizer(params: list[Any], setup: TrainingSetup, tracker: Any, kind: str = "fake", model: Any = None) -> Any:
    """The optimizer of ``setup`` over ``params``: the registry entry's ``trace_factory``
    (:mod:`cabe.trace.optim`), with the torch keywords of the setup's ``optimizer_impl`` (GaLore's: the model
    and the setup, to pick its targets)."""
    entry = optimizer.get(setup.optimizer)
    if entry.modelled:  # torchao's compiled step, layer-wise GaLore: modelled from the source (optimizer_modelled)
        raise ConfigError("optimizer_not_traced", "optimizer", value=setup.optimizer)
    impl = setup.resolved_optimizer_impl
    kw: dict[str, Any] = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    if entry.low_rank:
        kw = {"model": model, "setup": setup}
    module, _, name = entry.trace_factory.partition(":")
    factory = getattr(importlib.import_module(module), name)
    if setup.optimizer_in_backward and not entry.layerwise:  # torchtune's optimizer_in_bwd: one per parameter
        from cabe.trace.optim import InBackward

        return InBackward(params, lambda group: factory(group, kw, tracker, kind))
    return factory(params, kw, tracker, kind)


# ---- the batch ------------------------------------------------------------------------------
def make_inputs(cfg: Any, setup: TrainingSetup, device: Any) -> tuple[Any, Any, Any]:
    """A batch of random token ids, its labels (the same tensor, cloned; one class per sequence for a
    sequence-classification head) and its position_ids (None for padded rows: transformers counts them itself).

    Packed rows (``packing: packed``) hold :data:`PACKED_DOCUMENTS` documents each, their position_ids restarting
    at every document; a padding-free batch (``packing: padding-free``, TRL's ``DataCollatorWithFlattening``) is
    one row of batch × seq tokens whose position_ids restart at every sequence. Without an attention mask,
    transformers finds the documents from them (masking_utils.py:862-870, ``find_packed_sequence_indices``)."""
    import torch

    vocab = int(getattr(cfg, "vocab_size", 32000) or 32000)
    rows, row = (1, setup.batch * setup.seq) if setup.packing == "padding-free" else (setup.batch, setup.seq)
    ids = torch.randint(0, vocab, (rows, row), device=device)
    if getattr(cfg, "problem_type", None) == "single_label_classification":  # one class per sequence
        return ids, torch.randint(0, int(cfg.num_labels), (setup.batch,), device=device), None
    labels = ids.clone()
    return ids, labels, packed_positions(setup, device)


#: documents per packed row the trace builds (its memory does not depend on the count: the mask spans the row)
PACKED_DOCUMENTS = 4


def has_documents(setup: TrainingSetup) -> bool:
    """Rows holding several documents told apart by position_ids: packed rows, or a padding-free batch of more than
    one sequence (one sequence flattened is a plain row: its position_ids never restart)."""
    return setup.packing == "packed" or (setup.packing == "padding-free" and setup.batch > 1)


def packed_positions(setup: TrainingSetup, device: Any) -> Any:
    """position_ids restarting at every document (None for padded rows)."""
    import torch

    if not has_documents(setup):
        return None
    doc = setup.seq if setup.packing == "padding-free" else max(1, -(-setup.seq // PACKED_DOCUMENTS))
    rows, row = (1, setup.batch * setup.seq) if setup.packing == "padding-free" else (setup.batch, setup.seq)
    pos = torch.arange(row, device=device) % doc
    return pos.unsqueeze(0).expand(rows, row)


def autocast(setup: TrainingSetup) -> Any:
    """``torch.autocast('cuda')`` in the AMP dtype of ``setup``, or a null context."""
    import torch

    amp = autocast_dtype(setup)
    return torch.autocast("cuda", dtype=amp) if amp is not None else contextlib.nullcontext()
