"""``CabeCallback``: cabe's estimate for the ``Trainer`` run it is attached to, checked against
PyTorch's own peak-memory counters after the first steps.

    from cabe.integrations.transformers import CabeCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[CabeCallback(seq=2048)])

At ``on_train_begin`` it reads the model's config (unwrapping a PEFT model to its base model and
adapter config), the weights' dtype, the bitsandbytes quantization config and the
``TrainingArguments`` (batch, accumulation, bf16/fp16, gradient checkpointing, optim, FSDP /
DeepSpeed, world size), prints the estimate, and warns when it will not fit the visible GPU.
After ``compare_after_steps`` optimizer steps it compares with ``torch.cuda.max_memory_allocated``
and ``max_memory_reserved`` and logs both and the relative error; without CUDA the comparison is
recorded as ``{"skipped": "no_cuda"}``. It never touches the model or the ``TrainerControl``, and
a failure to estimate is logged, never raised: the run goes on as it would without it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import transformers
from transformers import TrainerCallback

from cabe.errors import CabeError

logger = logging.getLogger("cabe")


def _unwrap(model: Any) -> tuple[Any, Any]:
    """(base model, PEFT config or None) for a plain, PEFT-wrapped or DDP-wrapped model."""
    while hasattr(model, "module") and not hasattr(model, "config"):
        model = model.module
    peft_config = None
    configs = getattr(model, "peft_config", None)
    if isinstance(configs, dict) and configs:
        active = getattr(model, "active_adapter", None)
        if isinstance(active, (list, tuple)):
            active = active[0] if active else None
        peft_config = configs.get(active) if active in configs else next(iter(configs.values()))
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
    return model, peft_config


def _to_dict(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return dict(obj)
    if hasattr(obj, "to_dict"):
        return dict(obj.to_dict())
    return dict(vars(obj))


def _weights_dtype(model: Any) -> str | None:
    from cabe.configs._base import dtype

    for name, p in model.named_parameters():
        if "lora_" in name or not p.is_floating_point():
            continue
        return dtype(str(p.dtype))
    return None


def request_for_run(model: Any, args: Any = None, *, seq: int | None = None) -> tuple[dict[str, Any], Any]:
    """The cabe request for a model and its ``TrainingArguments``, and the merged bookkeeping."""
    from cabe import configs

    base, peft_config = _unwrap(model)
    config = _to_dict(base.config)
    quant = config.pop("quantization_config", None)
    sources: list[configs.Source] = []
    model_fields: dict[str, Any] = {}
    d = _weights_dtype(base)
    if d:
        model_fields["_dtype"] = d
    attn = getattr(base.config, "_attn_implementation", None)
    att = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash", "flash_attention_3": "flash"}.get(str(attn))
    if att:
        model_fields["attention"] = att
    # the transformers this run imports: its line decides the MoE layout and the checkpointing (cabe.transformers_line)
    model_fields["transformers"] = transformers.__version__
    sources.append(
        configs.Source(path="model", format="model", fields=model_fields, used=list(model_fields), ignored=[])
    )
    if args is not None:
        data = args.to_dict() if hasattr(args, "to_dict") else dict(vars(args))
        c = configs.module("training_args").collect(data)
        world = int(getattr(args, "world_size", 1) or 1)
        if world > 1 and "gpus" not in c.fields:
            c.fields["gpus"] = world
            if "shard" not in c.fields and not getattr(args, "deepspeed", None):
                c.fields["shard"] = "ddp"
        f, u, i = c.result()
        sources.append(configs.Source(path="TrainingArguments", format="training_args", fields=f, used=u, ignored=i))
    if peft_config is not None:
        data = _to_dict(peft_config)
        data.pop("base_model_name_or_path", None)  # the model in hand is what counts
        c = configs.module("peft_config").collect(data)
        f, u, i = c.result()
        sources.append(configs.Source(path="peft_config", format="peft_config", fields=f, used=u, ignored=i))
    if quant:
        c = configs.module("bnb").collect(_to_dict(quant))
        f, u, i = c.result()
        sources.append(configs.Source(path="quantization_config", format="bnb", fields=f, used=u, ignored=i))
    if getattr(base, "is_loaded_in_4bit", False) and not quant:
        sources.append(
            configs.Source(
                path="model", format="model", fields={"method": "qlora"}, used=["is_loaded_in_4bit"], ignored=[]
            )
        )
    combined = configs.combine(sources, overrides={"seq": seq} if seq else None)
    request = dict(combined.request)
    request.pop("model", None)
    request["config"] = config
    if peft_config is None and request.get("method") in (None, "full"):
        trainable = [p.requires_grad for p in base.parameters()]
        if trainable and not all(trainable):
            logger.info("cabe: some parameters are frozen; estimated as full fine-tuning")
    return request, combined


class CabeCallback(TrainerCallback):
    """Print cabe's estimate at ``on_train_begin``; compare with the measured peak after N steps.

    Args:
        compare_after_steps: optimizer steps after which to read ``torch.cuda.max_memory_*``.
        seq: sequence length of the batches (the ``TrainingArguments`` rarely say; SFTConfig's
            ``max_length`` is used when present, else cabe's default of 512).
        lang, units: language (``en``/``es``) and units (``GB``/``GiB``) of the printed lines.
        log: where lines go (default: ``print`` and the ``cabe`` logger).

    After the run: ``request``, ``report``, ``fit`` (the visible GPU's verdict, or
    ``{"skipped": "no_cuda"}``) and ``comparison`` (measured vs estimated, or ``{"skipped": ...}``).
    """

    def __init__(
        self,
        compare_after_steps: int = 3,
        *,
        seq: int | None = None,
        lang: str = "en",
        units: str = "GB",
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.compare_after_steps = max(1, int(compare_after_steps))
        self.seq = seq
        self.lang = lang
        self.units = units
        self._log = log
        self.request: dict[str, Any] | None = None
        self.report: Any = None
        self.fit: dict[str, Any] | None = None
        self.comparison: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.messages: list[str] = []

    # ---- output ----------------------------------------------------------------------------
    def log(self, text: str) -> None:
        self.messages.append(text)
        logger.info(text)
        (self._log or print)(text)

    def _bytes(self, n: int) -> str:
        from cabe.units import fmt_bytes

        return fmt_bytes(int(n), self.lang, self.units)

    # ---- TrainerCallback ----------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        from cabe import api
        from cabe.i18n import error_message, t
        from cabe.report.text import format_report

        if model is None:
            return None
        main = getattr(state, "is_world_process_zero", True)
        try:
            self.request, _ = request_for_run(model, args, seq=self.seq)
            self.report = api.build(self.request)
        except CabeError as err:
            self.error = err.to_dict(self.lang)
            if main:
                self.log(t("callback.failed", self.lang, message=error_message(err, self.lang)))
            return None
        r = self.report
        if main:
            self.log(format_report(r, lang=self.lang, units=self.units))
            self.log(
                t(
                    "callback.estimate",
                    self.lang,
                    peak=self._bytes(r.total_bytes),
                    reserved=self._bytes(r.reserved_bytes),
                    device=self._bytes(r.device_bytes),
                )
            )
        self._check_fit(main)
        return None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.comparison is None and self.report is not None and state.global_step >= self.compare_after_steps:
            self._compare(state.global_step, getattr(state, "is_world_process_zero", True))
        return None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.comparison is None and self.report is not None:
            self._compare(state.global_step, getattr(state, "is_world_process_zero", True))
        return None

    # ---- checks ------------------------------------------------------------------------------
    def _check_fit(self, main: bool) -> None:
        import torch

        from cabe.i18n import t

        if not torch.cuda.is_available():
            self.fit = {"skipped": "no_cuda"}
            return
        props = torch.cuda.get_device_properties(0)
        have = int(props.total_memory)
        need = int(self.report.device_bytes)
        self.fit = {
            "gpu": getattr(props, "name", "cuda:0"),
            "memory_bytes": have,
            "needed_bytes": need,
            "fits": need <= have,
            "margin_bytes": have - need,
        }
        if need > have:
            text = t("callback.does_not_fit", self.lang, need=self._bytes(need), have=self._bytes(have))
            warnings.warn(text, ResourceWarning, stacklevel=2)
            if main:
                self.log(text)
        elif main:
            self.log(t("callback.fits", self.lang, have=self._bytes(have), margin=self._bytes(have - need)))

    def _compare(self, step: int, main: bool) -> None:
        import torch

        from cabe.i18n import t

        if not torch.cuda.is_available():
            self.comparison = {"skipped": "no_cuda"}
            if main:
                self.log(t("callback.skipped.no_cuda", self.lang))
            return
        allocated = int(torch.cuda.max_memory_allocated())
        reserved = int(torch.cuda.max_memory_reserved())
        est, est_res = int(self.report.total_bytes), int(self.report.reserved_bytes)
        self.comparison = {
            "steps": int(step),
            "estimated_bytes": est,
            "measured_allocated_bytes": allocated,
            "error": (est - allocated) / allocated if allocated else None,
            "estimated_reserved_bytes": est_res,
            "measured_reserved_bytes": reserved,
            "error_reserved": (est_res - reserved) / reserved if reserved else None,
        }
        if main:
            self.log(
                t(
                    "callback.compare",
                    self.lang,
                    steps=step,
                    measured=self._bytes(allocated),
                    estimated=self._bytes(est),
                    error=_pct(self.comparison["error"]),
                    measured_reserved=self._bytes(reserved),
                    estimated_reserved=self._bytes(est_res),
                    error_reserved=_pct(self.comparison["error_reserved"]),
                )
            )


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}%"
