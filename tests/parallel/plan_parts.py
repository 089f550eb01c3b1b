"""The one-GPU StepParts of a request as estimate_model builds them, and the multi-GPU plan's (cabe.parallel), for the
tests of this directory that look at a plan's buffers one by one."""

from __future__ import annotations

from typing import Any

from cabe.activations import head_activations
from cabe.analytic.estimate import _layer_activations, _model_states, _step_parts, _weight_copies
from cabe.analytic.runs import _row_shape
from cabe.parallel import shard_parts
from cabe.precision import dtypes_for, resolve
from cabe.training import TrainingSetup


def both(spec: Any, setup: TrainingSetup) -> tuple[Any, Any]:
    """(one GPU's parts, the plan's parts) of ``setup``."""
    setup = _row_shape(resolve(setup, spec.dtype))
    dt = dtypes_for(setup)
    states = _model_states(spec, setup)
    act = _layer_activations(spec, setup, dt)
    one = _step_parts(spec, setup, dt, states, act, head_activations(spec, setup, dt), _weight_copies(spec, setup, dt))
    return one, shard_parts(one, spec, setup)[0]


def parts(spec: Any, setup: TrainingSetup) -> Any:
    """The plan's parts of ``setup``."""
    return both(spec, setup)[1]
