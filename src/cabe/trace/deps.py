"""What a trace needs installed for a setup: torch and transformers always, PEFT for the adapter methods,
bitsandbytes for QLoRA and the 8-bit optimizers, galore-torch for GaLore. A missing one is a
:class:`~cabe.errors.MissingDependencyError` (``pip install 'cabe[trace]'``)."""

from __future__ import annotations

from cabe import optimizer
from cabe.errors import MissingDependencyError
from cabe.trace import compat
from cabe.training import TrainingSetup

PEFT_METHODS = ("lora", "qlora", "prompt-tuning")


def needs_bitsandbytes(setup: TrainingSetup) -> bool:
    return setup.method == "qlora" or "bitsandbytes" in optimizer.get(setup.optimizer).extras


def needs_galore(setup: TrainingSetup) -> bool:
    return "galore-torch" in optimizer.get(setup.optimizer).extras


def needs_peft(setup: TrainingSetup) -> bool:
    return setup.method in PEFT_METHODS


def import_deps(setup: TrainingSetup | None = None) -> None:
    """Import what a trace needs, raising :class:`MissingDependencyError` for what is missing."""
    needed = ["torch", "transformers"]
    if setup is not None and needs_peft(setup):
        needed.append("peft")
    if setup is not None and needs_bitsandbytes(setup):
        needed.append("bitsandbytes")
    if setup is not None and needs_galore(setup):
        needed.append("galore_torch")
    if setup is not None and setup.objective == "grpo":
        # TRL's trainer module, imported here, before the trace's environment: it imports bitsandbytes, which picks
        # its CUDA backend when CUDA looks available (cabe.trace.grpo runs TRL's GRPO code)
        needed += ["peft", "trl", "trl.trainer.grpo_trainer"]
    # the supported window, read from the packages' metadata before any import (cabe.trace.compat)
    compat.check_window([_DISTRIBUTIONS.get(n, n) for n in needed if "." not in n] + ["accelerate"])
    if setup is not None and setup.objective in ("dpo", "orpo", "kto"):  # TRL's trainer code (cabe.trace.preference)
        needed.append("trl")
    for name in needed:
        try:
            __import__(name)
        except ImportError:
            raise MissingDependencyError("missing_extra", None, extra="trace", package=name) from None
    if setup is not None and setup.fp8 != "none":  # torchao for its recipes; Transformer Engine refused
        from cabe.trace import fp8

        fp8.refusal(setup)


#: import name -> distribution name, where they differ
_DISTRIBUTIONS = {"galore_torch": "galore-torch"}
