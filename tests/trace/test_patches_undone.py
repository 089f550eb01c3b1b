"""What a trace patches is undone when it ends, including what torch cached while the patches stood."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import fake_trace

from cabe import models
from cabe.trace import _native
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace


def test_torch_device_context_still_makes_torch_tensor_on_its_device_after_a_trace():
    """torch.utils._device caches its factory functions on first use; built during a trace it held the patched
    ``torch.tensor``, so ``torch.tensor(...)`` under ``with torch.device("meta")`` stayed on the host afterwards
    and a meta build of phi-4-mini (longrope's ``ext_factors * base**…``) failed in the same process."""
    if not _native.available():
        pytest.skip("the trace runs in a subprocess here: nothing of it stays in this process")
    import torch
    from torch.utils._device import _device_constructors

    _device_constructors()  # the cache built before the trace, as in a process that made a meta model first
    fake_trace(models.preset("gpt2").config, TrainingSetup(method="lora", dtype="bf16", batch=1, seq=64))
    with torch.device("meta"):
        assert torch.tensor([1.0, 2.0]).device.type == "meta"
        assert (torch.tensor([1.0, 2.0]) * torch.arange(2).float()).device.type == "meta"


def test_phi4_mini_longrope_is_traced_after_a_meta_build_in_the_same_process():
    """The differential's worker builds presets on the meta device before tracing them: the factory cache then
    held the real ``torch.tensor``, the trace's patched one was not in it, and phi-4-mini's longrope tables (a
    ``torch.tensor`` of the factors times a meta ``arange``) failed to build inside the trace."""
    if not _native.available():
        pytest.skip("the trace runs in a subprocess here")
    import torch
    from torch.utils._device import _device_constructors

    _device_constructors()
    with torch.device("meta"):
        torch.tensor([1.0])
    result = fake_trace(models.preset("phi-4-mini").config, TrainingSetup(method="lora", dtype="bf16", batch=1, seq=64))
    assert result.peak_bytes > 0


def test_a_patched_staticmethod_is_put_back_as_a_staticmethod():
    """_Patch keeps a class's own attribute as stored: the staticmethod DeviceMesh._concatenate (patched by
    cabe.trace.distributed._real_mesh_coordinates) comes back a staticmethod, not a plain function that an instance
    would bind."""
    from cabe.trace.patches import _Patch

    class Holder:
        @staticmethod
        def f(x):
            return x

    p = _Patch()
    p.set(Holder, "f", staticmethod(lambda x: -x))
    assert Holder().f(1) == -1
    p.restore()
    assert isinstance(vars(Holder)["f"], staticmethod) and Holder().f(1) == 1
