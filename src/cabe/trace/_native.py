"""A fake CUDA device for CPU-only PyTorch builds.

Autograd and ``torch.autocast('cuda')`` need a CUDA *device guard* and CUDA *hooks* that
say a device exists. A CPU wheel has neither: autograd on fake ``cuda`` tensors fails
("Cannot access accelerator device when none is available") or aborts the process.

This module compiles (once, cached) a tiny C++ shim against the installed torch headers
that registers ``c10::impl::FakeGuardImpl<DeviceType::CUDA>`` and a ``CUDAHooksInterface``
whose answers can be switched on and off at run time. The hooks are created by
``at::detail::getCUDAHooks()`` on first use, which happens while ``import torch`` runs, so
the shim must be loaded *before* torch is imported; :func:`preload` does that and is called
when :mod:`cabe.trace` is imported. When torch was imported first, :func:`available`
returns False and the engine runs the trace in a fresh subprocess instead.

Nothing here imports torch. No real CUDA work can happen through the shim: every kernel
call still goes to the fake (meta) implementations.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_SOURCE = r"""
// cabe fake-CUDA shim: a device guard and switchable CUDA hooks for CPU-only torch builds.
#include <atomic>
#include <c10/core/impl/FakeGuardImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <ATen/detail/CUDAHooksInterface.h>

static std::atomic<int> g_enabled{0};

namespace at {
struct CabeFakeCUDAHooks : public CUDAHooksInterface {
  CabeFakeCUDAHooks(CUDAHooksArgs) {}
  bool on() const { return g_enabled.load() != 0; }
  bool isBuilt() const override { return on(); }
  bool isAvailable() const override { return on(); }
  bool hasCUDA() const override { return on(); }
  bool hasPrimaryContext(DeviceIndex) const override { return on(); }
  DeviceIndex deviceCount() const override { return on() ? 1 : 0; }
  int getNumGPUs() const override { return on() ? 1 : 0; }
  DeviceIndex current_device() const override { return 0; }
  DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(DeviceIndex) const override {}
  DeviceIndex exchangeDevice(DeviceIndex) const override { return 0; }
  DeviceIndex maybeExchangeDevice(DeviceIndex) const override { return 0; }
  void init() const override {}
};
// Registered under the key getCUDAHooks() looks up ("CUDAHooks").
C10_REGISTER_TYPED_CLASS(CUDAHooksRegistry, "CUDAHooks", CabeFakeCUDAHooks);
}  // namespace at

namespace {
struct Reg {
  Reg() {
    auto& slot = c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)];
    if (slot.load() == nullptr) {
      static c10::impl::FakeGuardImpl<c10::DeviceType::CUDA> impl;
      slot.store(&impl);
    }
  }
} reg;
}  // namespace

// bit 0: a CUDA guard is registered; bit 1: the CUDA hooks in use are ours.
extern "C" int cabe_fake_cuda_status() {
  int guard = c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)].load() != nullptr;
  int prev = g_enabled.exchange(1);
  int hooks = at::detail::getCUDAHooks().hasCUDA() ? 2 : 0;
  g_enabled.store(prev);
  return guard | hooks;
}
extern "C" void cabe_fake_cuda_enable(int on) { g_enabled.store(on); }
"""

_lib: ctypes.CDLL | None = None
_reason: str = "not_attempted"
_detail: str = ""


def _torch_dir() -> Path | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def torch_has_cuda() -> bool:
    """Whether the installed torch wheel was built with CUDA (read without importing it)."""
    tdir = _torch_dir()
    if tdir is None:
        return False
    try:
        text = (tdir / "version.py").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("cuda") and "=" in line:
            return "None" not in line.split("=", 1)[1]
    return False


def _cache_dir() -> Path:
    base = os.environ.get("CABE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "cabe"
    )
    return Path(base)


class _ShimFailure(Exception):
    """Building the shim failed: ``code`` (``no_compiler``, ``compile_failed``), the compiler's own output."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(code)
        self.code = code
        self.detail = detail


def _build(tdir: Path) -> Path:
    version = (tdir / "version.py").read_text() if (tdir / "version.py").exists() else ""
    key = hashlib.sha256((_SOURCE + version + str(tdir)).encode()).hexdigest()[:16]
    out_dir = _cache_dir()
    out = out_dir / f"fakecuda-{key}.so"
    if out.exists():
        return out
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise _ShimFailure("no_compiler", "")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "fakecuda.cpp"
        src.write_text(_SOURCE)
        tmp_out = Path(tmp) / out.name
        base = [
            cxx,
            "-O1",
            "-shared",
            "-fPIC",
            "-std=c++17",
            "-w",
            f"-I{tdir / 'include'}",
            str(src),
            f"-L{tdir / 'lib'}",
            "-lc10",
            "-ltorch_cpu",
            f"-Wl,-rpath,{tdir / 'lib'}",
            "-o",
            str(tmp_out),
        ]
        proc = subprocess.run(base, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise _ShimFailure("compile_failed", proc.stderr[-400:])
        shutil.move(str(tmp_out), str(out))
    return out


def preload() -> bool:
    """Build and load the shim if torch is not imported yet. Never raises."""
    global _lib, _reason, _detail
    if _lib is not None:
        return True
    if os.environ.get("CABE_NO_FAKE_CUDA"):
        _reason = "disabled"  # CABE_NO_FAKE_CUDA is set
        return False
    if "torch" in sys.modules:
        _reason = "torch_imported"  # the shim must load before torch
        return False
    tdir = _torch_dir()
    if tdir is None:
        _reason = "no_torch"
        return False
    if torch_has_cuda():
        _reason = "torch_has_cuda"  # no shim needed
        return False
    try:
        path = _build(tdir)
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        if lib.cabe_fake_cuda_status() != 3:
            _reason = "hooks_missing"  # the shim loaded, its CUDA hooks were not picked up
            return False
    except _ShimFailure as exc:
        _reason, _detail = exc.code, exc.detail
        return False
    except Exception as exc:  # ABI mismatch, ...
        _reason = "shim_failed"
        _detail = f"{type(exc).__name__}: {str(exc)[:400]}"
        return False
    _lib = lib
    _reason = "loaded"
    _detail = ""
    return True


def available() -> bool:
    """Whether fake CUDA tensors can be traced in this process."""
    return _lib is not None


def reason() -> str:
    """Why the shim is or is not loaded, as a code: ``loaded``, ``not_attempted``, ``disabled``,
    ``torch_imported``, ``no_torch``, ``torch_has_cuda``, ``no_compiler``, ``compile_failed``,
    ``hooks_missing`` or ``shim_failed``
    (words: ``error.mode_unsupported.<code>`` in the trace catalogs)."""
    return _reason


def detail() -> str:
    """The compiler's or loader's own message when :func:`reason` is ``compile_failed`` or ``shim_failed``, else ``""``."""
    return _detail


def enable(on: bool) -> None:
    if _lib is not None:
        _lib.cabe_fake_cuda_enable(1 if on else 0)
