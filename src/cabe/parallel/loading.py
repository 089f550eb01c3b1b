"""Loading the checkpoint: the host RAM per node and one GPU's bytes while ``from_pretrained`` and the engine's
set-up put the weights in place, per loading path (:func:`load_memory`, pure; :func:`sizes` reads a GPU's
:class:`~cabe.parallel.strategy.Context`).

What the code does, read rather than guessed (transformers 5.25, accelerate 1.16, DeepSpeed 0.19.6 at
``edaa722``, torchtune at ``bd2a0fc``, safetensors 0.8):

* The model is built on the meta device (transformers ``modeling_utils.py:PreTrainedModel.get_init_context``:
  ``torch.device("meta")``), then every safetensors file is opened with ``safe_open(..., backend="mmap")`` and
  each tensor taken as ``get_slice(k)`` (``_load_pretrained_model``); ``core_model_loading.py:_materialize_copy``
  does ``tensor[...]`` then ``.to(device, dtype)``. ``tensor[...]`` is a *view of the mapped file* (measured:
  its ``data_ptr`` lies inside the file's mapping, no anonymous memory grows), so a tensor loaded on the CPU in
  the checkpoint's dtype costs no private memory: its pages are the page cache, shared by every process of the
  node and reclaimable. A tensor whose dtype changes (a bf16 checkpoint loaded as fp32 masters) is a new private
  copy. Four worker threads (``GLOBAL_WORKERS``) materialise tensors ahead of the main thread; none with
  on-the-fly quantization (bitsandbytes), which loads one tensor at a time. ``low_cpu_mem_usage`` is gone (popped
  and ignored in ``from_pretrained``): the meta-device path is the only one.
* Plain DDP / ZeRO-1/2 through the Trainer: every process loads the whole model on the host (no ``device_map``),
  then moves it to its GPU (``Trainer._move_model_to_device``; DeepSpeed's engine ``module.to(device)``).
  DeepSpeed ZeRO-1/2 then flattens the trainable 16-bit parameters into one buffer, on the GPU when it has the
  room (``stage_1_and_2.py:DeepSpeedZeroOptimizer.__init__``, ``flatten_on_accelerator``), beside the parameters.
* FSDP through accelerate (``utils/fsdp_utils.py:fsdp2_prepare_model``): with ``cpu_ram_efficient_loading``
  the non-main ranks move the model to meta, the model is sharded on meta, and
  ``fsdp2_load_full_state_dict`` sends rank 0's tensors one at a time (``full_tensor.to(device)`` on rank 0,
  ``torch.empty`` of the full size on the others, ``dist.broadcast``, ``distribute_tensor``): one full tensor
  beside the shards. Without it ``fully_shard`` moves each wrapped unit to the GPU whole and then shards it: one
  full unit beside the shards. transformers 4.x loaded nothing on the ranks other than each node's local rank 0
  (``load_shard_file``: "Skip it with fsdp on ranks other than 0"); transformers 5.25 loads on every rank, the
  flag only changing the missing keys' handling (``_move_missing_keys_from_meta_to_device``; transformers
  issue #43749, open), so every process's private copies exist at once.
* DeepSpeed ZeRO-3: ``zero.Init`` (``get_init_context``) builds each module's parameters on the GPU and
  partitions them when the module's ``__init__`` returns (``partition_parameters.py:Init._post_init_method``):
  one module's parameters whole at a time. ``_load_pretrained_model`` then reads every file on global rank 0 only
  (``map_location="cpu"`` there, ``"meta"`` elsewhere: views of the mapped files), and
  ``integrations/deepspeed.py:_load_state_dict_into_zero3_model`` gathers one module's parameters
  (``GatheredParameters(..., modifier_rank=0)``), copies rank 0's values in and re-partitions.
* QLoRA (bitsandbytes): ``quantizer_bnb_4bit.py:update_device_map`` sets ``device_map={"": current GPU}`` when
  none is given: each tensor goes straight to the GPU in the loaded dtype and is quantized there (its 16-bit
  copy beside its 4-bit form), one tensor at a time; accelerate's FSDP2 skips the rank-0 broadcast for
  ``Params4bit`` models. The whole (model-parallel share of the) model is on every GPU before any sharding.
  A blocking copy to the GPU that changes the dtype converts on the CPU first (ATen ``Copy.cu``,
  ``copy_requires_temporaries``): one tensor in the loaded dtype on the host.
* torchtune (``recipes/full_finetune_distributed.py:_setup_model``; ``training/_distributed.py:
  load_from_full_model_state_dict``): meta-device init, every rank reads the full state dict through mmap
  (``safe_torch_load``), rank 0's tensors are broadcast and sharded one at a time
  (``set_model_state_dict(broadcast_from_rank0=True)``): the FSDP rank-0 path above, with every rank's private
  copies (dtype changes, and the Llama q/k permutation of ``convert_weights.hf_to_tune``) counted per rank.

Not counted: the processes' own host memory (CUDA context, Python, the data loader), the caching allocator's
reserve (transformers' ``caching_allocator_warmup`` reserves the model's bytes on a ``device_map`` GPU), and
PEFT's adapters (built after the load; small).
"""

from __future__ import annotations

from dataclasses import dataclass

from cabe.architecture import ModelSpec
from cabe.parallel.strategy import Context
from cabe.precision import BYTES, loaded_dtype
from cabe.report import Step
from cabe.units import GB, GiB

#: the loading paths, chosen from the method and the data-parallel strategy (:func:`path_for`)
PATHS = ("host_full", "fsdp_units", "fsdp_rank0", "zero3_init", "device_map")
#: transformers 5.25 ``core_model_loading.py:GLOBAL_WORKERS`` = min(4, cpu_count)
WORKERS = 4


@dataclass(frozen=True)
class Sizes:
    """One GPU's model-parallel share of the model as the load sees it, in bytes (adapters excluded: PEFT builds
    them after the load)."""

    loaded_bytes: int  # the model as from_pretrained builds it, in the dtypes it loads
    converted_bytes: int  # of loaded_bytes: tensors loaded in another dtype than the checkpoint's (private copies)
    checkpoint_bytes: int  # the same tensors as the checkpoint stores them (the files read through mmap)
    largest_bytes: int  # the largest single parameter, as loaded
    largest_converted_bytes: int  # the largest parameter whose dtype changes, as loaded (0: none changes)
    largest_quantized_bytes: int  # QLoRA: the largest 4-bit weight as loaded before bitsandbytes quantizes it
    unit_bytes: int  # FSDP: the largest wrapped unit (one decoder layer, or the root) as stored
    trainable_bytes: int  # the trainable parameters as stored (ZeRO-1/2's flat 16-bit copy)


@dataclass(frozen=True)
class Load:
    """The load's peak: private host memory per node, the checkpoint's pages in the page cache per node (shared
    by the node's processes, reclaimable), and one GPU's allocated bytes."""

    path: str
    host_bytes_per_node: int
    page_cache_bytes_per_node: int
    gpu_bytes: int


def path_for(strategy: str, method: str, cpu_ram_efficient_loading: bool) -> str:
    """The loading path of a setup (one of :data:`PATHS`)."""
    if method == "qlora":
        return "device_map"
    if strategy == "zero3":
        return "zero3_init"
    if strategy in ("fsdp", "fsdp-hybrid"):
        return "fsdp_rank0" if cpu_ram_efficient_loading else "fsdp_units"
    return "host_full"


def load_memory(
    s: Sizes,
    *,
    path: str,
    strategy: str,
    per_node: int,
    resident_bytes: int,
    transformers_line: int = 5,
) -> Load:
    """The load's peak for ``path``.

    Args:
        s: the GPU's share of the model (:class:`Sizes`).
        path: one of :data:`PATHS` (:func:`path_for`).
        strategy: the data-parallel strategy (``zero1`` / ``zero2`` add DeepSpeed's flat 16-bit copy).
        per_node: processes (GPUs) per node.
        resident_bytes: the weights this GPU keeps once loaded and sharded (the strategy's), in bytes.
        transformers_line: 4 or 5; under FSDP with ``cpu_ram_efficient_loading``, 4.x loads on each node's local
            rank 0 only.

    Returns:
        host RAM per node: ``per_node`` × the private copies a process makes (``host_full``, ``fsdp_units``,
        ``fsdp_rank0`` on transformers 5), one process's (``fsdp_rank0`` on 4.x), none (``zero3_init``: rank 0
        reads views of the files, the dtype changes on the GPU's copy), or ``per_node`` × one tensor converted on
        the host (``device_map``). GPU: the whole model (``host_full``: moved whole; ZeRO-1/2: + the flat copy of
        the trainable parameters), the kept shards + one full unit (``fsdp_units``) or one full tensor
        (``fsdp_rank0``, ``zero3_init``), the whole model + one tensor's 16-bit copy (``device_map``).
    """
    if path not in PATHS:
        raise ValueError(f"unknown loading path {path!r}")  # a programming error: path_for names them
    if path == "device_map":
        host = per_node * s.largest_converted_bytes
        gpu = s.loaded_bytes + s.largest_quantized_bytes
    elif path == "zero3_init":
        host = 0
        gpu = resident_bytes + s.largest_bytes
    elif path == "fsdp_rank0":
        host = (1 if transformers_line < 5 else per_node) * s.converted_bytes
        gpu = resident_bytes + s.largest_bytes
    elif path == "fsdp_units":
        host = per_node * s.converted_bytes
        gpu = resident_bytes + s.unit_bytes
    else:
        host = per_node * s.converted_bytes
        gpu = s.loaded_bytes + (s.trainable_bytes if strategy in ("zero1", "zero2") else 0)
    return Load(path, host, s.checkpoint_bytes, gpu)


def sizes(c: Context, spec: ModelSpec) -> Sizes:
    """The :class:`Sizes` of the GPU ``c``: its held tensors, loaded in the setup's dtypes from a checkpoint in
    ``spec.dtype`` (None: taken to be the loaded dtype, nothing converted)."""
    setup, mine = c.setup, c.mine
    loaded_name = loaded_dtype(setup)
    qlora = setup.method == "qlora"
    half = loaded_name if BYTES.get(loaded_name) == 2 else setup.compute_dtype
    loaded = converted = checkpoint = largest = largest_conv = largest_q = 0.0
    for h in mine.held:
        t = h.tensor
        if t.kind in ("adapter", "prompt"):
            continue
        # the dtype from_pretrained gives it: QLoRA loads every base tensor in the loaded dtype (bitsandbytes
        # quantizes on the GPU, prepare_model_for_kbit_training casts to fp32 after); otherwise as stored
        name = loaded_name if qlora else ("fp32" if h.nbytes == 4 else half)
        b = BYTES.get(name, 2)
        ckpt = BYTES.get(spec.dtype, b) if spec.dtype else b
        elements = t.numel * h.count
        one = t.param_numel * b
        loaded += (elements * b) if (h.nbytes or qlora) else 0
        checkpoint += elements * ckpt
        largest = max(largest, one)
        if spec.dtype and name != spec.dtype:
            converted += elements * b
            largest_conv = max(largest_conv, one)
        if not h.nbytes:
            largest_q = max(largest_q, one)
    if qlora:
        loaded = float(c.weights)  # the 4-bit weights as bitsandbytes stores them, the rest as loaded
    return Sizes(
        loaded_bytes=round(loaded),
        converted_bytes=round(converted),
        checkpoint_bytes=round(checkpoint),
        largest_bytes=round(largest),
        largest_converted_bytes=round(largest_conv),
        largest_quantized_bytes=round(largest_q),
        unit_bytes=round(max(mine.layer_stored, mine.root_stored)),
        trainable_bytes=round(mine.trainable),
    )


def plan_load(c: Context, spec: ModelSpec, resident_bytes: float, per_node: int) -> Load:
    """The load's peak of the GPU ``c``, whose strategy keeps ``resident_bytes`` of weights."""
    setup = c.setup
    path = path_for(c.layout.strategy, setup.method, setup.cpu_ram_efficient_loading)
    return load_memory(
        sizes(c, spec),
        path=path,
        strategy=c.layout.strategy,
        per_node=per_node,
        resident_bytes=round(resident_bytes),
        transformers_line=setup.transformers_line,
    )


def load_json(load: Load) -> dict[str, int | str]:
    """The report's keys for the load (beside ``host_ram_load_peak_bytes_per_node``)."""
    return {
        "load_path": load.path,
        "gpu_load_peak_bytes": load.gpu_bytes,
        "host_page_cache_load_bytes_per_node": load.page_cache_bytes_per_node,
    }


def load_step(load: Load) -> Step:
    """The explanation line of the load."""
    params = {
        "path": load.path,
        "gpu": load.gpu_bytes,
        "gpu_gib": load.gpu_bytes / GiB,
        "host": load.host_bytes_per_node,
        "host_gb": load.host_bytes_per_node / GB,
        "cache": load.page_cache_bytes_per_node,
        "cache_gb": load.page_cache_bytes_per_node / GB,
    }
    return Step(
        "shard.load." + load.path,
        "GPU {gpu} B = {gpu_gib} GiB; host {host} B = {host_gb} GB private + {cache} B = {cache_gb} GB page cache",
        load.gpu_bytes,
        params,
    )
