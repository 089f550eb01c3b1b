"""Which releases the trace runs on, and the guard around every private name it patches.

The trace patches private names of transformers (a family's attention helpers, the fused kernels' call sites) and
reads a few of PEFT's. A release that renames one must refuse the family that needs it, in one sentence that names
the symbol and the installed version, and leave every other family traceable (issue 29: transformers 5.25 rewrote
Falcon's attention without ``FalconAttention._split_heads``, and a patch applied to every trace took down all of
them). So:

* :data:`WINDOW` is the supported window of each package the trace imports, the same bounds as the ``[trace]``
  extra of ``pyproject.toml`` (a test holds them equal); :func:`check_window` refuses an installed release outside
  it (``trace_unsupported_version``), reading ``importlib.metadata`` only (nothing is imported).
* :func:`require` and :func:`module` fetch a private symbol for one family's patch, or refuse that family
  (``trace_unsupported_transformers``) when the installed release does not have it.

:data:`TESTED` lists the releases the suite's trace smoke (``pytest -m smoke``) ran on: ``constraints.txt`` and the
newest lane of ``.ci/run`` (``scripts/test_newest.sh``), and transformers 4.57.6 by ``benchmarks/ecosystem/tf4.py``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from typing import Any

from cabe.errors import UnsupportedVersionError

#: package -> (lowest release, first release not supported); pyproject.toml's [trace] extra says the same
WINDOW: dict[str, tuple[str, str]] = {
    "torch": ("2.13", "2.14"),
    "transformers": ("4.57", "6"),
    "peft": ("0.21", "1"),
    "bitsandbytes": ("0.50", "1"),
    "accelerate": ("1.16", "2"),
}
#: the releases the trace smoke passed on (the newest first: the one a refusal recommends)
TESTED: dict[str, tuple[str, ...]] = {
    "torch": ("2.13.0",),
    "transformers": ("5.25.0", "5.24.0", "4.57.6"),
    "peft": ("0.22.0", "0.21.2"),
    "bitsandbytes": ("0.50.2",),
    "accelerate": ("1.16.0",),
}


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string (``"5.25.0"`` -> (5, 25, 0); ``"2.13.0+cpu"`` -> (2, 13, 0);
    ``"5.26.0.dev0"`` -> (5, 26, 0))."""
    parts: list[int] = []
    for piece in version.split("+", 1)[0].split("."):
        m = re.match(r"\d+", piece)
        if m is None:
            break
        parts.append(int(m.group()))
        if m.end() != len(piece):
            break
    return tuple(parts)


def window_text(package: str) -> str:
    lo, hi = WINDOW[package]
    return f"{package}>={lo},<{hi}"


def installed(package: str) -> str | None:
    """The installed release of ``package`` (its distribution's metadata), or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def in_window(package: str, version: str) -> bool:
    lo, hi = WINDOW[package]
    v = release(version)
    return release(lo) <= v < release(hi)


def check_window(packages: tuple[str, ...] | list[str]) -> None:
    """Refuse, in one sentence, an installed release outside the supported window (a package not installed is
    the caller's ``missing_extra``)."""
    for package in packages:
        version = installed(package)
        if version is not None and package in WINDOW and not in_window(package, version):
            raise UnsupportedVersionError(
                "trace_unsupported_version",
                None,
                package=package,
                version=version,
                window=window_text(package),
                works=TESTED[package][0],
            )


def transformers_version() -> str:
    return installed("transformers") or "?"


def transformers_at_least(version: str) -> bool:
    """Whether the installed transformers is ``version`` or newer (for code paths that changed between
    releases; each caller cites both sources)."""
    return release(transformers_version()) >= release(version)


#: the family of a patch every trace applies (its refusal says so: ``error.trace_unsupported_transformers.general``)
EVERY_FAMILY = "*"


def _refuse(family: str, symbol: str) -> UnsupportedVersionError:
    return UnsupportedVersionError(
        "trace_unsupported_transformers",
        "model",
        **({"why": "general"} if family == EVERY_FAMILY else {}),
        family=family,
        symbol=symbol,
        version=transformers_version(),
        window=window_text("transformers"),
        tested=", ".join(TESTED["transformers"]),
    )


def refuse_option(field: str, symbol: str) -> UnsupportedVersionError:
    """The refusal of a request field the installed transformers cannot apply (it lacks ``symbol``)."""
    err = _refuse(EVERY_FAMILY, symbol)
    return UnsupportedVersionError(err.code, field, **{**err.params, "why": "option"})


def refuse_moe_loop(model: Any, family: str) -> None:
    """transformers 4.57.6's MoE blocks route expert by expert: ``expert_hit = ....nonzero()`` and
    ``torch.where(expert_mask[expert_idx])`` (models/mixtral/modeling_mixtral.py:124-135; the same loop in Qwen2-MoE,
    Qwen3-MoE, DeepSeek-V3 ...), shapes that depend on the router's values, which fake tensors do not have.
    transformers 5 fuses the experts into 3-D parameters and runs them through ``grouped_mm`` (shapes known). A model
    with an ``nn.ModuleList`` of experts on transformers 4 is refused by family, in one sentence."""
    import torch

    if transformers_at_least("5"):
        return
    for m in model.modules():
        if isinstance(getattr(m, "experts", None), torch.nn.ModuleList):
            err = _refuse(family, f"{type(m).__name__}.experts (an nn.ModuleList routed token by token)")
            raise UnsupportedVersionError(err.code, err.field, **{**err.params, "why": "moe_loop"})


def module(name: str, family: str) -> Any:
    """``transformers.<name>`` (``"models.falcon.modeling_falcon"``) for ``family``'s patch, or the family's
    refusal."""
    try:
        return importlib.import_module(f"transformers.{name}")
    except ImportError:
        raise _refuse(family, f"transformers.{name}") from None


def require(obj: Any, dotted: str, family: str) -> Any:
    """``obj.<dotted>`` (``"FalconAttention._split_heads"``), or the refusal of ``family`` naming the symbol and
    the installed transformers."""
    value = obj
    for part in dotted.split("."):
        if not hasattr(value, part):
            where = getattr(obj, "__name__", type(obj).__name__)
            raise _refuse(family, f"{where}.{dotted}")
        value = getattr(value, part)
    return value
