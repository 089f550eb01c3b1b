"""Simulate real training steps on fake tensors and measure every allocation.

The step is the real thing: ``AutoModelForCausalLM.from_config`` (built on ``meta``, then
materialised on the fake device), PEFT / bitsandbytes wrappers, ``torch.autocast``,
gradient checkpointing, ``loss.backward()``, a real ``torch.optim`` (or bitsandbytes)
optimizer and ``zero_grad(set_to_none=True)``. Only the tensors are fake: they carry shape,
dtype and device but no data, so a 70B step costs seconds and no memory.

Modes:

* ``fake`` -- FakeTensorMode on a fake ``cuda`` device (see :mod:`cabe.trace._native` for
  how a CPU-only torch gets one). ``torch.autocast('cuda')`` and fused optimizers really run.
  If torch was imported before :mod:`cabe.trace` the shim cannot be installed in-process and
  the trace runs in a subprocess (:mod:`cabe.trace.worker`).
* ``meta`` -- plain meta tensors, no fake mode. AMP and fused optimizers cannot run there.
* ``cpu`` -- real tensors on the CPU: the exactness reference for tiny models (tests).
* ``auto`` -- ``fake`` when possible, else ``meta``.

This module orchestrates; the rooms are :mod:`~cabe.trace.result` (the result and its JSON),
:mod:`~cabe.trace.build` (model, method), :mod:`~cabe.trace.inputs` (optimizer, batch), :mod:`~cabe.trace.patches` (the environment),
:mod:`~cabe.trace.step` (the steps), :mod:`~cabe.trace.analysis` (events to a result),
:mod:`~cabe.trace.saved` (layer inventory) and :mod:`~cabe.trace.worker` (the subprocess).
"""

from __future__ import annotations

import os
import time
from typing import Any

from cabe import transformers_line
from cabe.errors import CabeError, ConfigError, trace_failed
from cabe.trace import _native, compat, state
from cabe.trace.analysis import TIMELINE_POINTS, analyse
from cabe.trace.build import LEARNING_RATE, build_model, decoder_layers, hf_config, load_dtype
from cabe.trace.deps import import_deps
from cabe.trace.family_patches import model_types
from cabe.trace.inputs import autocast_dtype
from cabe.trace.modes import check_setup as _check_setup
from cabe.trace.modes import fake_mode as _fake_mode
from cabe.trace.modes import tracker as _tracker
from cabe.trace.patches import trace_environment
from cabe.trace.result import TraceResult
from cabe.trace.step import fill_random, materialize, numel_stored, tag_params, train
from cabe.trace.worker import request as _subprocess
from cabe.training import TrainingSetup

__all__ = [
    "LEARNING_RATE",
    "TIMELINE_POINTS",
    "TraceResult",
    "analyse",
    "autocast_dtype",
    "build_model",
    "decoder_layers",
    "hf_config",
    "import_deps",
    "layer_inventory",
    "load_dtype",
    "materialize",
    "resolve_mode",
    "run_trace",
    "trace_environment",
    "trace_step",
]

_DEVICES = {"fake": "cuda", "meta": "meta", "cpu": "cpu", "cuda": "cuda"}


def resolve_mode(mode: str, setup: TrainingSetup) -> str:
    """``fake`` (in this process), ``fake-subprocess``, ``meta`` or ``cpu``."""
    import torch

    if mode not in ("auto", "fake", "meta", "cpu"):
        raise ConfigError("bad_choice", "mode", value=mode, allowed="auto, fake, meta")
    needs_fake = autocast_dtype(setup) is not None or setup.resolved_optimizer_impl == "fused"
    if mode in ("meta", "cpu"):
        if needs_fake and mode == "meta":
            raise ConfigError("mode_unsupported", "mode", mode=mode, why="needs_fake")
        if mode == "meta" and not compat.transformers_at_least("5"):
            # transformers 4.57.6's rotary embeddings open torch.autocast(device_type=x.device.type, enabled=False)
            # (models/llama/modeling_llama.py:98-99, the same in every family), which torch refuses for "meta";
            # 5.x asks maybe_autocast (utils/generic.py), which skips it
            raise ConfigError("mode_unsupported", "mode", mode=mode, why="transformers4_meta")
        if mode == "cpu" and autocast_dtype(setup) is not None:
            raise ConfigError("mode_unsupported", "mode", mode=mode, why="cpu_autocast")
        return mode
    if torch.cuda.is_available() or _native.available():
        return "fake"
    if _native.torch_has_cuda():
        return "fake"
    if not os.environ.get("CABE_NO_SUBPROCESS") and _native.reason() == "torch_imported":
        return "fake-subprocess"
    if mode == "fake" or needs_fake:
        raise ConfigError("mode_unsupported", "mode", mode=mode, why=_native.reason(), detail=_native.detail())
    return "meta"


def run_trace(
    config: dict[str, Any],
    setup: TrainingSetup,
    steps: int,
    kind: str,
    inventory: bool = False,
    hooks: dict[str, Any] | None = None,
) -> Any:
    """Run the simulation in this process.

    ``kind``: ``fake`` | ``meta`` (simulations), ``cpu`` (real tensors on the CPU: the
    exactness reference) or ``cuda`` (real tensors on a GPU: :mod:`cabe.trace.measure`).
    ``hooks``: optional ``{"on_step_start": f(step)}``. Returns a :class:`TraceResult`, or the
    layer inventory rows with ``inventory``.
    """
    import torch

    from cabe.trace.state import AttentionState

    t0 = time.perf_counter()
    if steps < 2 and not inventory:
        raise ConfigError("out_of_range", "steps", value=steps, minimum=2, maximum=100)
    transformers_line.check_traceable(setup.transformers)  # the trace runs what is installed
    if kind == "fake" and not torch.cuda.is_available() and not _native.available():
        # without the shim, autograd on fake CUDA tensors aborts the process: refuse instead
        raise ConfigError("mode_unsupported", "mode", mode="fake", why=_native.reason(), detail=_native.detail())
    if setup.objective == "grpo" and setup.distributed:  # cabe.trace.grpo runs TRL's step on one GPU
        raise ConfigError("trace_grpo_one_gpu", "gpus", value=setup.gpus)
    if setup.distributed:  # rank 0 of the real engine on a fake process group
        from cabe.trace import distributed

        if inventory:
            raise ConfigError("mode_unsupported", "inventory", mode=kind, why="distributed_inventory")
        return distributed.trace(config, setup, steps, kind)
    device = torch.device(_DEVICES[kind])
    if setup.objective == "grpo":  # generate traced in its own run, before this one's environment (cabe.trace.grpo)
        from cabe.trace.grpo_generate import traced_generation

        hooks = {**(hooks or {}), "grpo_generation": traced_generation(config, setup, kind)}
    with state.active(AttentionState(device)) as astate, trace_environment(kind, setup, model_types(config)):
        notes: list[str] = []
        facts: dict[str, Any] = {}
        model, cfg = build_model(config, setup, notes, facts)
        if setup.objective == "grpo":  # a separate reference model, built beside the policy (cabe.trace.grpo)
            from cabe.trace.grpo import reference_model

            hooks = {**(hooks or {}), "grpo_reference": reference_model(config, setup)}
        if kind in ("fake", "meta"):  # (real tensors have the router's values)
            compat.refuse_moe_loop(model, (model_types(config) or ("?",))[0])
        ref = None
        if setup.objective in ("dpo", "kto"):  # a separate reference, built as the policy is (cabe.trace.preference)
            from cabe.trace import preference

            ref = preference.reference_model(config, setup)
        result = _traced(model, cfg, setup, steps, kind, inventory, device, astate, hooks or {}, ref)
    if inventory:
        return result
    result.attention_kernels = dict(astate.choices)
    if "mamba2_fused_stand_in" in astate.choices:  # cabe.trace.ssm ran in place of mamba-ssm's kernel
        notes.append("trace_mamba2_stand_in")
    result.notes = notes + result.notes
    unmatched = facts.pop("lora_unmatched", None)
    result.model = facts
    # the LoRA targets PEFT dropped, for the note lora_target_unmatched (placeholders come from the setup)
    result.setup = {**setup.to_dict(), **({"lora_unmatched": unmatched} if unmatched else {})}
    result.seconds = time.perf_counter() - t0
    return result


def _gemm_4bit(setup: TrainingSetup) -> Any:
    """bitsandbytes' ``gemm_4bit`` op (QLoRA), whose dequantising fallback needs scratch memory."""
    import torch

    if setup.method != "qlora":
        return None
    try:
        return torch.ops.bitsandbytes.gemm_4bit.default
    except (AttributeError, RuntimeError):
        return None


def _traced(
    model: Any,
    cfg: Any,
    setup: TrainingSetup,
    steps: int,
    kind: str,
    inventory: bool,
    device: Any,
    astate: Any,
    hooks: dict[str, Any],
    ref: Any = None,
) -> Any:
    """Materialise ``model`` under the tracker, then run the steps (or collect the inventory)."""
    tracker = _tracker(setup, kind, device, astate, _gemm_4bit(setup))
    with _fake_mode(kind), tracker:
        tracker.set_phase("setup")
        materialize(model, device)
        if kind in ("cpu", "cuda"):
            fill_random(model)
        if setup.method == "qlora":
            from cabe.trace.quant import materialize as quant_materialize

            quant_materialize(model, setup, device, tracker)
            if kind in ("cpu", "cuda"):
                from cabe.trace.quant import fill_real

                fill_real(model)
        tag_params(model, tracker)
        n_params = sum(numel_stored(p) for p in model.parameters())
        trainable = [p for p in model.parameters() if p.requires_grad]
        n_train = sum(p.numel() for p in trainable)
        if inventory:
            from cabe.trace.saved import collect

            return collect(model, cfg, setup, device, tracker)
        if not trainable:
            raise ConfigError("nothing_to_train", "method", method=setup.method)
        if setup.objective in ("dpo", "kto"):  # TRL's DPO / KTO step (cabe.trace.preference)
            from cabe.trace import preference

            result = preference.train(ref, model, cfg, setup, steps, device, tracker, trainable, kind)
        else:
            result = train(model, cfg, setup, steps, device, tracker, trainable, kind, hooks)
    result.parameters = n_params
    result.trainable_parameters = n_train
    result.mode = kind
    return result


# ---- public entry points ---------------------------------------------------------------------
def trace_step(config: dict[str, Any], setup: TrainingSetup, *, steps: int = 2, mode: str = "auto") -> TraceResult:
    """Trace ``steps`` training steps of the model ``config`` trained as ``setup``.

    Raises :class:`~cabe.errors.ConfigError` for configs transformers cannot build and
    :class:`~cabe.errors.MissingDependencyError` when the ``[trace]`` extra is missing.
    """
    setup = _check_setup(setup, config)
    if setup.objective in ("dpo", "orpo", "kto"):  # TRL's step, or a typed refusal: never an SFT step in its place
        from cabe.trace import preference  # (GRPO's own checks: cabe.trace.grpo)

        preference.check(setup)
    import_deps(setup)
    if not isinstance(steps, int) or isinstance(steps, bool) or not 2 <= steps <= 100:
        raise ConfigError("out_of_range", "steps", value=steps, minimum=2, maximum=100)
    kind = resolve_mode(mode, setup)
    if kind == "fake-subprocess":
        return TraceResult.from_json(_subprocess("trace", config, setup, steps))
    try:
        return run_trace(config, setup, steps, kind)
    except CabeError:
        raise
    except MemoryError:
        raise
    except Exception as exc:  # an architecture or op the simulation cannot run
        raise trace_failed(exc) from exc


def layer_inventory(config: dict[str, Any], setup: TrainingSetup, *, mode: str = "auto") -> list[dict[str, Any]]:
    """Tensors decoder layer 0 saves for backward during one forward (checkpointing off).

    Each row: ``module`` (path inside the layer), ``op`` (the aten op that allocated the
    storage), ``saved_by`` (the autograd node(s) holding it for backward), ``grad_fn`` (the
    node that produced the tensor), ``shape``, ``dtype``,
    ``bytes`` (the storage, rounded to 512 B; 0 when the storage was already listed -- see
    ``shared_with``), ``kind`` (activation | parameter | weight_copy), ``name`` (parameter name).
    """
    setup = _check_setup(setup, config)
    import_deps(setup)
    if setup.checkpointing:
        setup = setup.with_(checkpointing=False, checkpoint_every=1, offload_activations=False)
    kind = resolve_mode(mode, setup)
    if kind == "fake-subprocess":
        return _subprocess("inventory", config, setup, 1)["rows"]
    try:
        return run_trace(config, setup, 1, kind, inventory=True)
    except CabeError:
        raise
    except Exception as exc:
        raise trace_failed(exc) from exc
