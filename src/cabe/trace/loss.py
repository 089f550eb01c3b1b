"""Loss kernels a trace runs: transformers' own (``hf``) or torchtune's chunked cross-entropy.

``chunked`` reproduces torchtune's two halves on a transformers model:

* ``TransformerDecoder.chunked_output`` (torchtune/modules/transformer.py, ~l. 497 in 0.6): the output
  projection applied to ``last_hidden_state.chunk(num_output_chunks, dim=1)``, one logits tensor per chunk
  (all of them alive until the loss is done: together as large as the whole logits);
* ``CEWithChunkedOutputLoss.forward`` (torchtune/modules/loss/ce_chunked_output_loss.py, l. 65-100): the
  labels ``tensor_split`` the same way, each logits chunk ``reshape(-1, V)``, upcast ``.float()`` and
  ``F.cross_entropy(..., reduction="sum")`` one at a time, the sum divided by the count of real labels.

The recipes shift the labels themselves (``torch.hstack((labels[..., 1:], ignore))``, e.g.
recipes/full_finetune_single_device.py). Liger's and Apple's kernels are Triton: not traceable here
(:data:`TRACEABLE`), so the trace refuses them with a typed error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cabe.errors import ConfigError
from cabe.training import TrainingSetup

#: the loss kernels the trace can run (pure PyTorch)
TRACEABLE = ("hf", "chunked", "litgpt")
#: LitGPT's ``lm_head_chunk_size`` in its fine-tuning loops (finetune/lora.py, full.py, adapter.py: 128)
LITGPT_CHUNK = 128
IGNORE_INDEX = -100


def check(setup: TrainingSetup) -> None:
    """Refuse a loss kernel the trace cannot run (Triton kernels)."""
    if setup.resolved_loss not in TRACEABLE:
        raise ConfigError("loss_not_traceable", "loss", value=setup.resolved_loss, traceable=", ".join(TRACEABLE))


def _causal_lm(model: Any) -> Any:
    """The transformers ``*ForCausalLM`` inside a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class Chunks(list[Any]):
    """The logits chunks; Granite's forward divides the logits by ``logits_scaling``
    (modeling_granitemoehybrid.py, ``logits / self.config.logits_scaling``): each chunk is divided (a new chunk
    each, the old one freed), as a chunked output scaled per chunk would be."""

    def __truediv__(self, d: Any) -> Chunks:
        return Chunks(c / d for c in self)


def chunked_cross_entropy(chunks: list[Any], labels: Any, n: int) -> Any:
    """torchtune's ``CEWithChunkedOutputLoss.forward`` on the logits chunks and unshifted labels."""
    import torch
    import torch.nn.functional as F

    ignore = torch.full((labels.shape[0], 1), IGNORE_INDEX, dtype=labels.dtype, device=labels.device)
    labels = torch.hstack((labels[..., 1:], ignore))
    total_elements = (labels != IGNORE_INDEX).sum()
    label_chunks = [c.reshape(-1) for c in labels.tensor_split(n, dim=1)]
    logit_chunks = [c.reshape(-1, c.size(-1)) for c in chunks]
    total_loss: Any = 0.0
    for logits_chunk, labels_chunk in zip(logit_chunks, label_chunks, strict=False):
        total_loss += F.cross_entropy(logits_chunk.float(), labels_chunk, ignore_index=IGNORE_INDEX, reduction="sum")
    return total_loss / total_elements


def litgpt_cross_entropy(holder: Any, chunks: list[Any], labels: Any) -> Any:
    """LitGPT's fine-tuning loss on the lm_head's chunks and unshifted labels, as its loop runs it
    (litgpt/finetune/lora.py, v0.5.13): ``logits = model(input_ids, lm_head_chunk_size=128)`` — the name bound to
    the new chunks only now, so the previous step's were alive through this forward — then ``logits[-1] =
    logits[-1][..., :-1, :]`` and ``chunked_cross_entropy(logits, targets[..., 1:])`` (litgpt/utils.py:302-332):
    each chunk ``reshape(-1, V)`` (a copy of the sliced last one when the batch is above 1) and ``cross_entropy(...,
    reduction="none")`` in the logits' own dtype, the sum over the count of real labels. ``holder`` keeps the chunks
    as the loop's ``logits`` does: through backward and the optimizer step, until the next step's exist."""
    import torch
    import torch.nn.functional as F

    chunks[-1] = chunks[-1][..., :-1, :]
    holder._cabe_litgpt_logits = chunks  # (the previous step's are freed here, as LitGPT's rebinding frees them)
    targets = labels[..., 1:]
    logit_chunks = [c.reshape(-1, c.size(-1)) for c in chunks]
    target_chunks = [t.reshape(-1) for t in targets.split(chunks[0].size(1), dim=1)]
    losses = [
        F.cross_entropy(lc, tc, ignore_index=IGNORE_INDEX, reduction="none")
        for lc, tc in zip(logit_chunks, target_chunks, strict=True)
    ]
    real = (targets != IGNORE_INDEX).sum()
    return torch.cat(losses).sum() / real.maximum(torch.ones_like(real))


@contextlib.contextmanager
def loss_kernel(model: Any, setup: TrainingSetup) -> Iterator[None]:
    """Run the model's forward with ``setup``'s loss kernel (``hf``: as transformers does)."""
    check(setup)
    if setup.resolved_loss == "hf":
        yield
        return
    litgpt = setup.resolved_loss == "litgpt"
    n = setup.loss_chunks
    lm = _causal_lm(model)
    head = lm.get_output_embeddings()
    project = head.forward

    # Gemma 2's forward soft-caps the whole logits (modeling_gemma2.py: ``logits / cap``, ``tanh``, ``* cap``),
    # which a list of chunks cannot take: the cap is applied to each chunk here, and taken off the config
    # for the step (torchtune's Gemma 2 caps each chunk of its chunked output the same way)
    config = lm.config
    cap = getattr(config, "final_logit_softcapping", None)

    def chunked_output(hidden: Any) -> Chunks:
        # NOTE: torchtune splits the hidden states with ``chunk`` and the labels with ``tensor_split``;
        # they agree when n divides the sequence (else torchtune's loss fails on mismatched chunks), so
        # both are ``tensor_split`` here
        # (LitGPT: ``x.split(lm_head_chunk_size, dim=1)``, litgpt/model.py GPT.forward)
        pieces = hidden.split(LITGPT_CHUNK, dim=1) if litgpt else hidden.tensor_split(n, dim=1)
        chunks = [project(chunk) for chunk in pieces]
        if cap is not None:
            import torch

            chunks = [torch.tanh(c / cap) * cap for c in chunks]
        return Chunks(chunks)

    def loss_function(logits: Any, labels: Any, vocab_size: int, **kwargs: Any) -> Any:
        if litgpt:
            return litgpt_cross_entropy(lm, logits, labels)
        return chunked_cross_entropy(logits, labels, n)

    head.forward = chunked_output
    lm.loss_function = loss_function
    if cap is not None:
        config.final_logit_softcapping = None
    try:
        yield
    finally:
        del head.forward
        del lm._loss_function
        if cap is not None:
            config.final_logit_softcapping = cap
