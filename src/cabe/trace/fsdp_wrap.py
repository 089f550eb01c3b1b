"""How FSDP2 cuts the model into units, as the engine a user runs cuts it (the request's ``fsdp_wrap``).

* ``accelerate`` -- accelerate's own ``fsdp2_prepare_model`` (accelerate 1.16 utils/fsdp_utils.py:740-937), called
  here as the Trainer and ``accelerate launch`` call it: ``fully_shard`` on each decoder layer (its
  ``transformer_based_wrap`` over the model's ``_no_split_modules``), on the input embedding when it is not tied
  (lines 880-881), on [final norm, lm_head] -- with the input embedding when tied -- as one unit with
  ``reshard_after_forward=False`` (lines 883-893: gathered from its forward to its post-backward), then on the root
  with FSDP2's own ``None`` (lines 895-899). accelerate carves the embedding and the tail since 1.14.
* ``layers`` -- ``fully_shard`` on each decoder layer, then the root (embeddings, final norm, lm_head), which FSDP2
  never reshards (``None``, turned to ``False`` by its lazy init: torch 2.13 _fsdp_state.py:203-207): accelerate up
  to 1.13, and FSDP1's ``transformer_based_wrap``.

Both take the setup's ``reshard_after_forward`` for the decoder layers, its ``param_dtype`` as FSDP2's
``MixedPrecisionPolicy`` and its offload as ``CPUOffloadPolicy``; accelerate is told mixed precision ``"no"`` and no
``cpu_ram_efficient_loading``, so it changes no dtype and loads nothing: the model is built in the setup's dtypes
already (cabe.configs reads accelerate's fp32 upcast into the request: ``dtype``), and loading is not the step.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from cabe.trace import offload
from cabe.trace.build import decoder_layers
from cabe.training import TrainingSetup

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def policies(setup: TrainingSetup) -> tuple[Any, Any]:
    """FSDP2's ``MixedPrecisionPolicy`` (the setup's ``param_dtype``) and offload policy, as every unit gets them.

    FSDP2's CPU offload (torch 2.13 _fsdp_api.py ``CPUOffloadPolicy``, pin_memory=True by default): the sharded
    parameters and gradients pinned on the host, each unit's shards copied to the GPU for its all-gather
    (_fsdp_param.py:896-900), each reduce-scattered gradient copied back (_fsdp_collectives.py:711-742), the
    optimizer stepping on the host; accelerate's ``fsdp_offload_params`` passes it to every unit and the root."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    policy = CPUOffloadPolicy() if offload.offloads(setup) else OffloadPolicy()
    mp = MixedPrecisionPolicy()
    if setup.param_dtype != "none":
        mp = MixedPrecisionPolicy(param_dtype=getattr(torch, _DTYPES[setup.param_dtype]))
    return mp, policy


def apply(model: Any, cfg: Any, setup: TrainingSetup, dp: Any, mp: Any, policy: Any) -> str:
    """``fully_shard`` the model's units on the data-parallel mesh ``dp`` with the :func:`policies`; returns the
    wrapping as the report names it."""
    from torch.distributed.fsdp import fully_shard

    if setup.fsdp_wrap == "accelerate":
        return _accelerate(model, setup, dp, mp, policy)
    layers = decoder_layers(model, cfg)
    for layer in layers:
        fully_shard(
            layer, mesh=dp, mp_policy=mp, offload_policy=policy, reshard_after_forward=setup.reshard_after_forward
        )
    fully_shard(model, mesh=dp, mp_policy=mp, offload_policy=policy)
    return f"fully_shard per decoder layer ({len(layers)} units) + root"


class _Mesh:
    """accelerate indexes its device mesh by the FSDP dimensions' names (fsdp_utils.py:769): here, the mesh the
    trace made for data parallelism (HSDP's 2-D one, or the data-parallel part of a TP mesh)."""

    def __init__(self, dp: Any) -> None:
        self.dp = dp

    def __getitem__(self, names: Any) -> Any:
        return self.dp


def _accelerate(model: Any, setup: TrainingSetup, dp: Any, mp: Any, policy: Any) -> str:
    import accelerate
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from torch.distributed.fsdp import FSDPModule

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        reshard_after_forward=setup.reshard_after_forward,
        cpu_offload=policy,
        mixed_precision_policy=mp,
        cpu_ram_efficient_loading=False,
        auto_wrap_policy="transformer_based_wrap",
        activation_checkpointing=False,
    )
    # what fsdp2_prepare_model reads of its Accelerator (fsdp_utils.py:758-830): the plugin, the mesh, whether this
    # is the main process (rank 0: yes), the mixed precision ("no": the setup's dtypes stand) and the device
    stand_in = SimpleNamespace(
        state=SimpleNamespace(fsdp_plugin=plugin),
        torch_device_mesh=_Mesh(dp),
        parallelism_config=SimpleNamespace(fsdp_dim_names=("dp_shard",)),
        is_main_process=True,
        mixed_precision="no",
        device=None,  # (read for ignored modules and the rank-0 load only: neither here)
    )
    fsdp2_prepare_model(stand_in, model)  # (in place: the model it returns is this one)
    units = sum(1 for m in model.modules() if isinstance(m, FSDPModule))
    return (
        f"accelerate {accelerate.__version__} fsdp2_prepare_model: {units} units (each decoder layer, the input "
        "embedding, [final norm, lm_head] kept gathered from forward to backward, the root)"
    )
