"""Run as a script (``python tower_prefill_trace.py CONFIG IMAGES SIZE``): the vision tower's forward without
gradients (serving's prefill), traced on fake CUDA tensors, printed in bytes. A script, in a fresh process, because
cabe's fake-CUDA shim must load before torch (cabe.trace._native), which pytest has imported already."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import cabe.trace  # noqa: F401 (the fake-CUDA shim, before torch)
from cabe.training import TrainingSetup


def _traced_tower_prefill(config: dict, images: int, size: str) -> int:
    """The tower's forward without gradients (``get_image_features`` under ``torch.no_grad``), traced on fake
    CUDA tensors with the tracker the step uses: the peak above the weights, without cuBLAS's workspace."""
    import os

    import torch

    from cabe.trace import state, vision
    from cabe.trace.build import build_model
    from cabe.trace.engine import _fake_mode, _tracker
    from cabe.trace.inputs import make_inputs
    from cabe.trace.patches import trace_environment
    from cabe.trace.state import AttentionState
    from cabe.trace.step import materialize
    from cabe.trace.tracker import NO_WORKSPACES_ENV

    setup = TrainingSetup(precision="bf16", batch=1, seq=4096, images=images, image_size=size)
    device = torch.device("cuda")
    os.environ[NO_WORKSPACES_ENV] = "1"
    try:
        with state.active(AttentionState(device)) as astate, trace_environment("fake", setup):
            model, cfg = build_model(copy.deepcopy(config), setup, [], {})
            tracker = _tracker(setup, "fake", device, astate, None)
            with _fake_mode("fake"), tracker:
                tracker.set_phase("setup")
                materialize(model, device)
                ids, _, _ = make_inputs(cfg, setup, device)
                start = len(tracker.events)
                with vision.simulated(True):
                    kwargs = vision.image_inputs(cfg, setup, device, ids)
                    kwargs.pop("position_ids", None)
                    kwargs.pop("input_ids", None)
                    tracker.set_phase("forward")
                    with torch.no_grad():
                        model.model.get_image_features(**kwargs)
    finally:
        os.environ.pop(NO_WORKSPACES_ENV, None)
    curve = tracker.curve()
    return max(curve[start:]) - curve[start - 1]


if __name__ == "__main__":
    print(_traced_tower_prefill(json.loads(Path(sys.argv[1]).read_text()), int(sys.argv[2]), sys.argv[3]))
