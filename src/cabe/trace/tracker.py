"""Record every storage allocation and free, as the CUDA caching allocator would see them.

:class:`AllocationTracker` is a ``TorchDispatchMode``. After each aten op it looks at the
op's outputs; a storage it has not seen is a new allocation. Its size is the storage's
``nbytes`` rounded up to 512 B, the caching allocator's granularity (``kMinBlockSize`` /
``round_size`` in ``c10/cuda/CUDACachingAllocator.cpp``). A ``weakref.finalize`` on the
Python storage object records the free when the storage dies (storages keep their Python
object alive exactly as long as the C++ ``StorageImpl``, so the finalizer fires at the real
free). Views and in-place ops share an existing storage and cost nothing, as on the GPU.

Allocations made *inside* a CUDA kernel wrapper that never surface as op outputs (flash
attention's backward scratch, bitsandbytes' dequantized weight) are invisible to a
dispatch mode; :mod:`cabe.trace.kernels` adds them explicitly through :meth:`scratch`.

Each allocation carries the phase it was made in, a region tag (``logits`` while the LM
head and loss run) and the op that made it; the engine tags weights, gradients and
optimizer state afterwards, and :meth:`classify` assigns every live allocation at the peak
to exactly one component.
"""

from __future__ import annotations

import os
import weakref
from array import array
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cabe.units import CUBLAS_WORKSPACE

GRANULE = 512  # kMinBlockSize: every CUDA block is a multiple of 512 bytes

COMPONENTS = (
    "weights",
    "weight_copies",
    "gradients",
    "optimizer",
    "activations",
    "logits",
    "optimizer_temporaries",
    "cuda_workspaces",
    "other",
)

#: cuBLAS's workspace (cabe.units.CUBLAS_WORKSPACE: 32 MiB on sm90, once per handle and stream): the first
#: matmul of the forward and the first of the backward (autograd's device thread, its own handle) each get one.
#: set to "1" (tests that compare a simulated run with a real CPU run; inherited by trace subprocesses)
NO_WORKSPACES_ENV = "CABE_TRACE_NO_CUBLAS_WORKSPACES"
CUBLAS_OPS = frozenset(
    getattr(torch.ops.aten, n).default for n in ("mm", "addmm", "bmm", "baddbmm", "_addmm_activation", "addmv", "mv")
)

#: (``reference``: the no-grad log-prob passes of GRPO and the preference trainers; ``kl``: KTO's KL rows;
#: cabe.trace.grpo, cabe.trace.preference)
PHASES = ("setup", "forward", "backward", "optimizer", "reference", "kl")


def round_up(n: int) -> int:
    """The allocator's ``round_size``: at least 512 bytes, a multiple of 512."""
    if n <= 0:
        return 0
    return ((n + GRANULE - 1) // GRANULE) * GRANULE


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class AllocationTracker(TorchDispatchMode):
    """Dispatch mode that logs allocations; see the module docstring."""

    def __init__(
        self, device_type: str = "cuda", intercept: Callable[[Any, Any, tuple, dict], Any] | None = None
    ) -> None:
        super().__init__()
        self.device_type = device_type  # only storages on this device count
        self.intercept = intercept  # (tracker, func, args, kwargs) -> result or NotImplemented
        self.ignored: set[int] = set()  # allocations no longer counted (see forget)
        self.released: set[int] = set()  # allocations freed while their storage object lives on (see release)
        self.host_scalars_in_optimizer = False
        self.live: dict[int, int] = {}  # storage key -> allocation id
        self.size = array("q")  # allocation id -> rounded bytes
        self.raw_size = array("q")  # allocation id -> exact bytes
        self.phase_of = array("b")  # allocation id -> phase index at allocation
        self.step_of = array("h")  # allocation id -> step number at allocation
        self.region_of: list[str | None] = []
        self.op_of: list[str] = []
        self.tag: dict[int, str] = {}  # allocation id -> fixed component (weights, gradients...)
        self.paged: set[int] = set()  # allocations in CUDA managed memory (not in allocated)
        self.copy_of_weight: set[int] = set()
        # event log: +id+1 for malloc, -(id+1) for free
        self.events = array("q")
        self.event_phase = array("b")
        self.event_step = array("h")
        self.live_bytes = 0
        self.phase = 0
        self.step = 0
        self.region: str | None = None
        self.weight_keys: set[int] = set()
        self.paged_mode = False
        self.enabled = True
        self.workspace_phases: set[int] = set()  # forward (1) and backward (2) once they made cuBLAS's
        # a tensor as counted: its local shard for a DTensor (cabe.trace.distributed), whose wrapper holds no memory
        self.local: Callable[[Any], Any] | None = None
        # host (CPU) storages counted apart, when a simulated GPU run keeps states on the host (FSDP2's CPU offload)
        self.host: HostTally | None = None

    # ---- recording ------------------------------------------------------------------
    def set_phase(self, name: str) -> None:
        self.phase = PHASES.index(name)

    def _new(self, st: Any, nbytes: int, op: str) -> int:
        aid = len(self.size)
        rounded = round_up(nbytes)
        self.size.append(rounded)
        self.raw_size.append(nbytes)
        self.phase_of.append(self.phase)
        self.step_of.append(self.step)
        self.region_of.append(self.region)
        self.op_of.append(op)
        if self.paged_mode:
            self.paged.add(aid)
        else:
            self.live_bytes += rounded
        self.events.append(aid + 1)
        self.event_phase.append(self.phase)
        self.event_step.append(self.step)
        return aid

    def _free(self, key: int, aid: int) -> None:
        if self.live.get(key) == aid:
            del self.live[key]
        if aid in self.ignored or aid in self.released:
            return
        if aid not in self.paged:
            self.live_bytes -= self.size[aid]
        self.events.append(-(aid + 1))
        self.event_phase.append(self.phase)
        self.event_step.append(self.step)

    def record(self, t: torch.Tensor, op: str = "") -> int | None:
        """Register ``t``'s storage if it is new; return its allocation id."""
        if self.local is not None:
            t = self.local(t)
        if t.device.type != self.device_type:
            if self.host is not None and t.device.type == "cpu":
                self.host.record(t)
            return None
        if self.host_scalars_in_optimizer and self.phase == 3 and t.dim() == 0:
            # a CPU run: optimizers keep their `step` counters in host memory (not on a GPU)
            return None
        st = t.untyped_storage()
        key = st._cdata
        aid = self.live.get(key)
        if aid is not None:
            return aid
        nbytes = st.nbytes()
        if nbytes == 0:
            return None
        aid = self._new(st, nbytes, op)
        self.live[key] = aid
        weakref.finalize(st, self._free, key, aid)
        return aid

    def scratch(self, nbytes: int, op: str) -> Callable[[], None]:
        """Record a kernel-internal allocation; call the returned function to free it."""
        if nbytes <= 0:
            return lambda: None
        aid = self._new(None, nbytes, op)

        def free() -> None:
            self.live_bytes -= self.size[aid]
            self.events.append(-(aid + 1))
            self.event_phase.append(self.phase)
            self.event_step.append(self.step)

        return free

    def forget(self, t: torch.Tensor) -> None:
        """Stop counting ``t``'s storage now (e.g. a CPU-resident optimizer ``step`` in a CPU run)."""
        aid = self.aid_of(t) if t.device.type == self.device_type else None
        if aid is None or aid in self.ignored:
            return
        self._free(-1, aid)
        self.ignored.add(aid)

    def release(self, t: torch.Tensor) -> None:
        """Count ``t``'s storage as freed now, though the storage object lives on (FSDP2 shrinks it in place with
        ``untyped_storage().resize_(0)``, which no dispatch mode sees); a later :meth:`record` of the regrown
        storage is a new allocation."""
        st = t.untyped_storage()
        aid = self.live.get(st._cdata)
        if aid is None or aid in self.ignored or st.nbytes() == 0:
            return
        self._free(st._cdata, aid)
        self.released.add(aid)  # (its finalizer, when the storage object dies, finds it freed)

    def aid_of(self, t: torch.Tensor) -> int | None:
        return self.live.get(storage_key(t))

    def tag_tensor(self, t: torch.Tensor | None, component: str) -> None:
        if t is None or not isinstance(t, torch.Tensor):
            return
        aid = self.record(t, "tagged")
        if aid is not None:
            self.tag[aid] = component

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.intercept is not None:
            res = self.intercept(self, func, args, kwargs)
            if res is not NotImplemented:
                return res
        out = func(*args, **kwargs)
        if not self.enabled:
            return out
        if func in CUBLAS_OPS and self.phase in (1, 2) and self.phase not in self.workspace_phases:
            self._cublas_workspace(out)
        name = None
        if isinstance(out, torch.Tensor):
            name = func.__name__
            aid = self.record(out, name)
            if aid is not None and self.weight_keys and func is torch.ops.aten._to_copy.default:
                src = args[0] if args else None
                if isinstance(src, torch.Tensor) and storage_key(src) in self.weight_keys:
                    self.copy_of_weight.add(aid)
        elif isinstance(out, (tuple, list)):
            for o in out:
                if isinstance(o, torch.Tensor):
                    self.record(o, name or func.__name__)
                elif isinstance(o, (tuple, list)):
                    for oo in o:
                        if isinstance(oo, torch.Tensor):
                            self.record(oo, name or func.__name__)
        return out

    def _cublas_workspace(self, out: Any) -> None:
        """The first matmul of the forward, and the first of the backward, makes cuBLAS's workspace."""
        # (a simulated CUDA run: fake CUDA tensors, or meta ones; a real CPU run has no cuBLAS)
        if (
            os.environ.get(NO_WORKSPACES_ENV) != "1"
            and isinstance(out, torch.Tensor)
            and out.device.type == self.device_type in ("cuda", "meta")
        ):
            self.workspace_phases.add(self.phase)
            self.tag[self._new(None, CUBLAS_WORKSPACE, "cublas_workspace")] = "cuda_workspaces"

    # ---- analysis --------------------------------------------------------------------
    def replay(self, upto: int) -> set[int]:
        """Allocation ids live (and not paged) after event index ``upto`` (inclusive)."""
        live: set[int] = set()
        ev = self.events
        for i in range(upto + 1):
            e = ev[i]
            if e > 0:
                live.add(e - 1)
            else:
                live.discard(-e - 1)
        return live - self.paged

    def curve(self) -> array:
        """Live allocated bytes after each event."""
        out = array("q")
        cur = 0
        size = self.size
        paged = self.paged
        for e in self.events:
            if e > 0:
                a = e - 1
                if a not in paged:
                    cur += size[a]
            else:
                a = -e - 1
                if a not in paged:
                    cur -= size[a]
            out.append(cur)
        return out

    def classify(self, aid: int) -> str:
        tag = self.tag.get(aid)
        if tag is not None:
            return tag
        if aid in self.copy_of_weight:
            return "weight_copies"
        if self.region_of[aid] == "logits":
            return "logits"
        phase = PHASES[self.phase_of[aid]]
        if phase == "optimizer":
            return "optimizer_temporaries"
        if phase in ("forward", "backward", "reference"):
            return "activations"
        return "other"


class HostTally:
    """Host (CPU) memory beside a simulated GPU's: every CPU storage the dispatch mode sees, at its exact size (pinned
    or not; the CUDA host allocator's own rounding is not applied), and the most live at once in each step."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock  # the step being run
        self.live: dict[int, int] = {}  # storage key -> bytes
        self.live_bytes = 0
        self.peak_by_step: dict[int, int] = {}

    def record(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = st._cdata
        nbytes = st.nbytes()
        if key in self.live or nbytes == 0:
            return
        self.live[key] = nbytes
        self.live_bytes += nbytes
        self._mark()
        weakref.finalize(st, self._free, key)

    def _free(self, key: int) -> None:
        self._mark()  # (the level before the free)
        self.live_bytes -= self.live.pop(key, 0)

    def _mark(self) -> None:
        step = self.clock()
        if self.live_bytes > self.peak_by_step.get(step, 0):
            self.peak_by_step[step] = self.live_bytes

    def peak(self, step: int) -> int:
        """The most host bytes live at once in ``step`` (those carried into it when it made none)."""
        return self.peak_by_step.get(step, self.live_bytes)
