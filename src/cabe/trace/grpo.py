"""A GRPO step on fake CUDA tensors with TRL's own code (trl 1.16.0): the rollout's no-grad log-prob passes and the
policy's loss, forward and backward, as ``GRPOTrainer`` runs them.

What runs is TRL's: ``add_fused_lm_head`` patches the policy (and a separate reference model) as
``GRPOTrainer.__init__`` does (grpo_trainer.py:1066-1077); the log-probs are ``GRPOTrainer._get_per_token_logps_and
_entropies`` and the loss ``GRPOTrainer._compute_loss`` (l.3020-3292), called on a stand-in ``self`` that holds the
attributes ``__init__`` would set from a default ``GRPOConfig``; the rollout is split with TRL's
``shuffle_sequence_dict`` and ``split_tensor_dict`` (l.1540-1547). The rollout's tensors are made as
``_generate_and_score_completions`` leaves them (l.2487-2502 and 2859-2935); the completions themselves come from
:mod:`cabe.trace.generate` (``generate`` traced in its own run: :func:`generation`).

What fake tensors cannot decide is told from what the trace knows of its own batch (every completion as long as
``max_completion_length``, no padding, no NaN):

* ``hidden_states[mask]``, ``labels[mask]`` and ``masked_select`` (the fused head's compact path, trainer/utils.py:
  1642-1660, and ``masked_scatter``'s backward) have as many rows as the mask has completion positions;
* ``index_put_`` with that mask (the index's backward) writes in place;
* ``.item()`` (the metrics) reads 0;
* the Triton kernels that fold each logits tile (kernels/chunked_logprob.py, ``_forward_kernel`` /
  ``_backward_kernel``) write in place into tensors already allocated: they run as no-ops, so the compact path that
  CUDA takes (``_use_triton``) is the one traced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from cabe.objectives.grpo import shape
from cabe.trace.inputs import autocast
from cabe.training import TrainingSetup


def _modes() -> Any:
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten

    class Decided(TorchDispatchMode):
        """The data-dependent ops of the step, their sizes from the batch the trace built."""

        def __init__(self, completion: int) -> None:
            super().__init__()
            self.completion = completion

        def rows(self, mask: Any) -> int:
            if mask.dim() == 2:  # [b, s-1]: every completion position scored
                return int(mask.shape[0]) * min(self.completion, int(mask.shape[1]))
            return int(mask.numel())

        def __torch_dispatch__(self, func: Any, types_: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func is aten.index.Tensor:
                x, idx = args[0], args[1]
                if len(idx) == 1 and idx[0] is not None and idx[0].dtype is torch.bool:
                    m = idx[0]
                    return torch.empty((self.rows(m), *x.shape[m.dim() :]), dtype=x.dtype, device=x.device)
            if func is aten.masked_select.default:
                x, m = args[0], args[1]
                return torch.empty((self.rows(m),), dtype=x.dtype, device=x.device)
            if func in (aten.index_put_.default, aten._index_put_impl_.default, aten.index_put.default):
                x, idx = args[0], args[1]
                if any(i is not None and i.dtype is torch.bool for i in idx):
                    return x if func is not aten.index_put.default else torch.empty_like(x)
            if func is aten._local_scalar_dense.default and isinstance(args[0], FakeTensor):
                return False if args[0].dtype is torch.bool else 0
            return func(*args, **kwargs)

    return Decided


@contextlib.contextmanager
def kernels(kind: str) -> Iterator[None]:
    """TRL's Triton tile kernels as no-ops on fake tensors (they write into buffers already allocated), and the
    compact path CUDA takes; real tensors (``cpu``, ``cuda``) run as they are."""
    from trl.kernels import chunked_logprob
    from trl.trainer import utils as trl_utils

    if kind not in ("fake", "meta"):
        yield
        return

    class _Launch:
        def __getitem__(self, grid: Any) -> Any:
            return lambda *a, **k: None

    saved = {
        (chunked_logprob, "_use_triton"): chunked_logprob._use_triton,
        (trl_utils, "_use_triton"): trl_utils._use_triton,
        (chunked_logprob, "_forward_kernel"): chunked_logprob._forward_kernel,
        (chunked_logprob, "_backward_kernel"): chunked_logprob._backward_kernel,
        (chunked_logprob, "triton"): getattr(chunked_logprob, "triton", None),
    }
    try:
        chunked_logprob._use_triton = trl_utils._use_triton = lambda device: True
        chunked_logprob._forward_kernel = chunked_logprob._backward_kernel = _Launch()
        chunked_logprob.triton = types.SimpleNamespace(cdiv=lambda a, b: -(-a // b))
        yield
    finally:
        for (mod, name), value in saved.items():
            setattr(mod, name, value)


@contextlib.contextmanager
def no_padding() -> Iterator[None]:
    """``masking_utils._ignore_causal_mask_sdpa`` reads the padding mask on the host (masking_utils.py:252-303) so
    that SDPA gets ``is_causal`` and no mask where none is needed; on a fake mask it gives up and a mask is built,
    which CUDA would not build for this batch (every row full length, ``attention_mask`` all ones): here it reads a
    host mask of ones of the same shape, as :mod:`cabe.trace.generate` does."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    from cabe.trace import compat

    mu = compat.module("masking_utils", compat.EVERY_FAMILY)
    real = compat.require(mu, "_ignore_causal_mask_sdpa", compat.EVERY_FAMILY)

    def ignore(padding_mask: Any, q_length: int, kv_length: int, q_offset: Any, kv_offset: int, *a: Any) -> bool:
        if not isinstance(padding_mask, FakeTensor):
            return bool(real(padding_mask, q_length, kv_length, q_offset, kv_offset, *a))
        with unset_fake_temporarily():
            ones = torch.ones(tuple(padding_mask.shape), dtype=torch.bool)
            offset = 0 if isinstance(q_offset, torch.Tensor) else q_offset
            return bool(real(ones, q_length, kv_length, offset, kv_offset, *a))

    mu._ignore_causal_mask_sdpa = ignore
    try:
        yield
    finally:
        mu._ignore_causal_mask_sdpa = real


class _Accelerator:
    """What ``_compute_loss`` asks of the Accelerator on one process."""

    num_processes = 1
    is_main_process = True
    sync_gradients = True

    def __init__(self, setup: TrainingSetup) -> None:
        self.setup = setup

    def autocast(self) -> Any:
        return autocast(self.setup)

    def gather(self, x: Any) -> Any:
        return x

    gather_for_metrics = gather

    def reduce(self, x: Any, reduction: str = "sum") -> Any:
        return x

    def unwrap_model(self, model: Any) -> Any:
        return model


def trainer(model: Any, setup: TrainingSetup) -> Any:
    """A stand-in ``GRPOTrainer`` self: the attributes ``__init__`` sets from a default GRPOConfig
    (grpo_trainer.py:782-946) and the request's."""
    from trl import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.default is not dataclasses.MISSING}
    args = types.SimpleNamespace(**{**defaults, "beta": setup.beta, "steps_per_generation": shape(setup).steps})
    text = model.config.get_text_config()
    coef = getattr(text, "router_aux_loss_coef", 0.0)
    me = types.SimpleNamespace(
        args=args,
        accelerator=_Accelerator(setup),
        model=model,
        beta=setup.beta,
        loss_type=args.loss_type,
        epsilon_low=args.epsilon,
        epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        importance_sampling_level=args.importance_sampling_level,
        off_policy_mask_threshold=args.off_policy_mask_threshold,
        top_entropy_quantile=args.top_entropy_quantile,
        use_vllm=False,
        vllm_importance_sampling_correction=args.vllm_importance_sampling_correction,
        aux_loss_enabled=hasattr(text, "output_router_logits") and coef != 0.0,
        router_aux_loss_coef=coef,
        _entropy_bonus_enabled=args.entropy_coef != 0.0 or args.use_adaptive_entropy,
        entropy_coef=args.entropy_coef,
        use_adaptive_entropy=args.use_adaptive_entropy,
        current_gradient_accumulation_steps=setup.grad_accum,
        max_completion_length=setup.max_completion_length,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    me._get_per_token_logps_and_entropies = types.MethodType(GRPOTrainer._get_per_token_logps_and_entropies, me)
    me._compute_loss = types.MethodType(GRPOTrainer._compute_loss, me)
    return me


def reference_model(config: dict[str, Any], setup: TrainingSetup) -> Any:
    """GRPOTrainer's separate reference model when ``beta`` > 0 without PEFT (grpo_trainer.py:992-1003): the same
    model in the policy's dtype, in eval mode (``prepare_model(..., evaluation_mode=True)``, l.1188), nothing trained;
    None when there is none. Built on ``meta`` beside the policy, before the trace's fake mode."""
    if shape(setup).ref != "model":
        return None
    from cabe.trace.build import build_model

    ref, _ = build_model(config, setup.with_(method="full", checkpointing=False, objective="sft"), [])
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


class Runner:
    """The GRPO parts of a traced step (:func:`cabe.trace.step.train` calls them): :meth:`rollout` at the start of
    each step (phase ``reference``), :meth:`micro_batch` for each micro-batch."""

    def __init__(
        self, model: Any, cfg: Any, setup: TrainingSetup, device: Any, tracker: Any, kind: str, ref: Any = None
    ) -> None:
        from trl.trainer.utils import add_fused_lm_head

        self.model, self.setup, self.device, self.tracker, self.kind = model, setup, device, tracker, kind
        self.sh = shape(setup)
        self.vocab = int(getattr(cfg.get_text_config(), "vocab_size", 0) or 32000)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        add_fused_lm_head(base, temperature=1.0, outputs=("log_probs", "entropy"))
        self.ref = self._reference(ref) if self.sh.ref == "model" and ref is not None else None
        self.me = trainer(model, setup)
        self.buffer: list[dict[str, Any]] = []
        self.used = 0
        self.decided = _modes()
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> Runner:
        self.stack.enter_context(kernels(self.kind))
        if self.kind in ("fake", "meta"):
            self.stack.enter_context(no_padding())
        return self

    def __exit__(self, *exc: Any) -> None:
        self.buffer = []
        self.stack.close()

    def _reference(self, ref: Any) -> Any:
        """The reference model of :func:`reference_model` (materialised on the device by the caller), its parameters
        counted with the weights, its own fused head (l.1074-1077)."""
        from trl.trainer.utils import add_fused_lm_head

        for t in (*ref.parameters(), *ref.buffers()):
            self.tracker.tag_tensor(t, "weights")
        add_fused_lm_head(ref, temperature=1.0)
        return ref

    def rollout(self, step_start: bool = False) -> None:
        """The generation batch as ``_generate_and_score_completions`` leaves it, its no-grad log-probs made batch
        rows at a time, shuffled and split into ``steps_per_generation`` micro-batches (phase ``reference``)."""
        if not step_start and self.buffer and self.used < len(self.buffer):
            return
        with self.decided(self.sh.c):
            self._rollout()

    def _rollout(self) -> None:
        import torch
        from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict, use_adapter

        self.tracker.set_phase("reference")
        g, p, c, dev = self.sh.g, self.sh.p, self.sh.c, self.device
        prompt_ids = torch.randint(0, self.vocab, (g, p), device=dev)
        prompt_mask = torch.ones(g, p, dtype=torch.long, device=dev)
        completion_ids = torch.randint(0, self.vocab, (g, c), device=dev)
        completion_mask = torch.ones(g, c, dtype=torch.long, device=dev)
        num_items = completion_mask.sum()
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logps: dict[str, Any] = {}
        b = self.setup.batch
        with torch.no_grad():
            was = self.model.training
            if self.sh.old:
                logps["old_per_token_logps"] = self.me._get_per_token_logps_and_entropies(
                    self.model, ids, mask, c, batch_size=b
                )[0]
            if self.sh.ref == "model":
                logps["ref_per_token_logps"] = self.me._get_per_token_logps_and_entropies(
                    self.ref, ids, mask, c, batch_size=b
                )[0]
            elif self.sh.ref == "adapter":
                with use_adapter(self.model, adapter_name=None):
                    logps["ref_per_token_logps"] = self.me._get_per_token_logps_and_entropies(
                        self.model, ids, mask, c, batch_size=b
                    )[0]
            self.model.train(was)
        del ids, mask
        advantages = torch.zeros(g, dtype=torch.float32, device=dev)
        batch = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "advantages": advantages,
            "num_items_in_batch": num_items,
            **logps,
        }
        self.buffer = []  # (the previous generation's buffer is replaced: l.1545-1547)
        self.buffer = split_tensor_dict(shuffle_sequence_dict(batch), self.sh.steps)  # type: ignore[arg-type]
        self.used = 0
        del batch, prompt_ids, prompt_mask, completion_ids, completion_mask, advantages, logps, num_items

    def micro_batch(self, micro: int, scaler: Any) -> None:
        """``_compute_loss`` on the next slice, then its backward (the Trainer's ``training_step``)."""
        self.rollout()
        inputs = self.buffer[self.used % len(self.buffer)]
        self.used += 1
        with self.decided(self.sh.c):
            self.tracker.set_phase("forward")
            with autocast(self.setup):
                loss = self.me._compute_loss(self.model, inputs)
            self.tracker.set_phase("backward")
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            del loss, inputs


def join_generation(res: Any, tracker: Any, step_starts: list[int], generated: dict[str, int] | None) -> None:
    """The generation phase of the last step: what is live when it begins (the policy's states, the reference's
    weights, the previous rollout) beside what ``generate`` holds beyond the weights (:func:`traced_generation`);
    the step's peak when it is the largest."""
    from cabe.trace.analysis import _components

    if generated is None or not step_starts or step_starts[-1] == 0:
        return
    live = tracker.replay(step_starts[-1] - 1) - tracker.ignored
    comps = {k: v for k, v in _components(tracker, live).items() if v}
    for k, v in generated.items():
        comps[k] = comps.get(k, 0) + v
    total = sum(comps.values())
    res.phase_peaks = {"generation": total, **res.phase_peaks}
    if total > res.peak_bytes:
        res.peak_bytes, res.peak_phase, res.components = total, "generation", comps
