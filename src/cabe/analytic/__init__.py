"""The analytic estimate (package cabe.analytic; the function cabe.estimate is the public face): (model, setup) -> Report, with the peak taken where it really is.

The training step is walked at layer granularity, steady state (step 2 onwards: optimizer state
exists from the start; ``zero_grad(set_to_none=True)`` frees gradients after each step):

1. forward: weights + optimizer state (+ gradients when accumulating) + autocast weight copies +
   saved activations of every layer + the loss head (logits, fp32 upcast, log-softmax);
2. backward at the head: log-softmax gradients (fp32) on top of everything saved;
3. backward through layer i (both ends are checked; in between it is linear in i): gradients of
   layers ≥ i exist, activations and weight copies of layers ≤ i are still saved, plus the
   layer's backward workspace (with checkpointing, the layer's recomputed activations);
4. optimizer step: weights + gradients + state + step temporaries.

The peak is the largest of these moments; its components are what is live then, and they sum
to ``total_bytes``. CUDA context and allocator slack are reported beside it, never inside.

The rooms: :mod:`.estimate` composes :mod:`.states` (weights, gradients, optimizer state, weight copies),
:mod:`.runs` (the activations of every run of layers), :mod:`.parts` (what each moment of the step holds),
:mod:`.notes` and :mod:`.explain`; :mod:`.lesson` keeps the seed's formulas.
"""

from cabe.analytic.estimate import estimate_model
from cabe.analytic.lesson import (
    ALLOCATOR_SLACK_FRACTION,
    BYTES_PER_PARAM_PRESETS,
    DEFAULT_CUDA_CONTEXT_BYTES,
    estimate_lesson,
    estimate_simple,
)

__all__ = [
    "ALLOCATOR_SLACK_FRACTION",
    "BYTES_PER_PARAM_PRESETS",
    "DEFAULT_CUDA_CONTEXT_BYTES",
    "estimate_lesson",
    "estimate_model",
    "estimate_simple",
]
