"""The vision tower in a training step: what it saves for backward, its forward and backward moments, its
gradients, the images' masks, composed per tower kind from :mod:`cabe.vision.qwen25`, :mod:`cabe.vision.siglip` and
:mod:`cabe.vision.qwen3` (:func:`tower_activations`, :func:`with_images`). Proved by tests/families/test_qwen2_5_vl.py,
test_gemma3_images.py, test_qwen3_vl.py, test_vision_qlora.py and tests/trace/test_qwen2_5_vl_trace.py.

Qwen2.5-VL's tower (transformers 5.24 ``Qwen2_5_VisionTransformerPretrainedModel``,
models/qwen2_5_vl/modeling_qwen2_5_vl.py:386-489), the first one modelled:

A tower block is a decoder layer of the Llama lineage with other names: RMSNorm (``Qwen2_5_VLRMSNorm``, the same
fp32 upcast and rsqrt as Llama's), one fused ``qkv`` linear whose output v is a view of (the whole qkv output stays
alive while v is saved), 2-D rotary on q and k, SDPA without a mask (``is_causal=False``) on each window or
image, whose outputs are concatenated for ``proj``, RMSNorm and a SwiGLU MLP. So one block's saved tensors are
:func:`cabe.activations.layer_activations` of a spec made of the block (:func:`cabe.vision.qwen25.block_spec`), per patch token, with
the attention's span the window's patches (``window_size / patch_size`` squared: 64 for Qwen2.5-VL) or, in the
full-attention blocks, the image's. The residual between blocks is the patch embedding's output, a 16-bit
tensor under autocast (Conv3d is on autocast's 16-bit list), the weights' dtype otherwise.

Around the blocks (per patch, when gradients flow through the tower):

* the patch embedding's Conv3d saves its input (the pixels cast to the compute dtype: channels·2·14·14 values)
  when its weight trains;
* the rotary tables, cos and sin in fp32 (head_dim each), gathered in window order once and shared by every
  block (``apply_rotary_pos_emb_vision`` calls ``.float()`` on fp32 tables: no copy);
* the merger: its RMSNorm (4h + 4, and the normalised tensor when the weight trains), the first linear's input,
  and GELU's input and output (4h values per merged token each: h per patch).

Without gradient through the tower (LoRA on the decoder only, freeze, prompt tuning) it saves nothing; its
forward's largest moment is one block's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cabe.activations import layer_activations
from cabe.architecture import ModelSpec
from cabe.method import VISION_PREFIX, vision_lora_targets
from cabe.precision import Dtypes
from cabe.step import StepParts
from cabe.tensors import Tensor
from cabe.training import TrainingSetup
from cabe.units import round_alloc
from cabe.vision import qwen3, qwen25, siglip
from cabe.vision.block import patch_values
from cabe.vision.images import ImageGrid, check_images


@dataclass(frozen=True)
class TowerActivations:
    """The tower's figures for one micro-batch, in bytes; per block (bottom first) what it keeps through the
    forward, what it saves when it runs for backward (a checkpointed block is recomputed whole), and its backward
    transient."""

    saved: int  # everything the tower keeps for backward (0 when no gradient flows through it)
    forward_transient: int  # the largest transient of the tower's forward
    blocks: int  # kept by the blocks alone
    around: int  # saved outside the blocks (patch embedding, rotary tables, merger)
    kept: tuple[int, ...] = ()
    full: tuple[int, ...] = ()
    workspace: tuple[int, ...] = ()
    checkpointed: tuple[bool, ...] = ()


def tower_targets(spec: ModelSpec, setup: TrainingSetup) -> tuple[str, ...]:
    """The tower's linears LoRA adapts (by their names in a block), or () when none."""
    return tuple(dict.fromkeys(lin.name for lin, _ in vision_lora_targets(spec, setup)))


def tower_in_path(spec: ModelSpec, setup: TrainingSetup) -> bool:
    """Whether the tower's forward records a graph for backward: it trains (full), LoRA adapts some of its linears,
    or its input requires grad. transformers' ``enable_input_require_grads`` (modeling_utils.py:2147-2180, 5.24)
    hooks the input embeddings of every ``PreTrainedModel`` inside the model, the tower's ``patch_embed`` too; LoRA
    and prompt tuning call it under checkpointing (cabe.trace.build; PEFT's prepare_model_for_kbit_training does not
    with ``use_reentrant=False``, other.py:229-233)."""
    if setup.method == "full" or tower_targets(spec, setup):
        return True
    hooked = spec.vision is not None and spec.vision.input_hooked
    return hooked and setup.checkpointing and setup.method in ("lora", "prompt-tuning")


def tower_dtypes(dt: Dtypes) -> Dtypes:
    """The tower's residual is the Conv3d patch embedding's output: the compute dtype (autocast's, or the
    weights')."""
    return replace(dt, residual=dt.compute)


def tower_activations(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, grid: ImageGrid) -> TowerActivations:
    """The tower's saved bytes and transients for ``setup.batch × setup.images`` images of ``grid``."""
    tower = spec.vision
    if tower is None or not setup.images:
        return TowerActivations(0, 0, 0, 0)
    images = setup.batch * setup.images
    n = images * grid.patches  # patch tokens through every block
    trains = setup.method == "full"
    targets = tower_targets(spec, setup)
    is_siglip = tower.kind == "siglip"  # (LayerNorm blocks over the whole image, a pooled projector)
    is_qwen3 = tower.kind == "qwen3_vl"  # (cabe.vision.qwen3: LayerNorm blocks over the whole image, DeepStack mergers)
    vspec = siglip.block_spec(tower) if is_siglip else qwen3.block_spec(tower) if is_qwen3 else qwen25.block_spec(tower)
    # QLoRA with an fp32 residual (fp32 norm weights after prepare_model_for_kbit_training, or without it bf16 norm
    # weights under fp16 autocast, which promote): the normed input is fp32 (``self.weight *
    # hidden_states.to(input_dtype)``, modeling_qwen2_5_vl.py:79) and the 4-bit linears return their input's dtype
    # (bitsandbytes nn/modules.py:626-637), so the tower's residual is fp32 from the first block's output on
    # (traced: Qwen2.5-VL-7B QLoRA without k-bit preparation, bf16 under fp16 autocast, 3 images of 1280x720: −9.6%
    # with the blocks counted in 16 bits)
    fp32_tower = setup.method == "qlora" and dt.residual == 4
    vdt = dt if is_siglip else replace(dt, residual=4) if fp32_tower and not is_qwen3 else tower_dtypes(dt)
    window = grid.patches if is_siglip or is_qwen3 else (tower.window_size // tower.patch_size) ** 2
    full = len([b for b in tower.full_attention_blocks if b < tower.depth])
    spans = ((tower.depth - full, min(window, grid.patches)), (full, grid.patches))
    lora = bool(targets)
    method = "full" if trains or not lora else ("qlora" if setup.method == "qlora" else "lora")
    block_names = [n for n in targets if n in {lin.name for lin in tower.block_linears}]
    vsetup = setup.with_(method=method, lora_targets=tuple(block_names) or ("all-linear",))
    vsetup = vsetup.with_(
        batch=1, packing="none", images=0, checkpointing=False, checkpoint_every=1, offload_activations=False
    )
    in_path = tower_in_path(spec, setup)
    c = vdt.compute
    # the forward's largest transient in a block: rotary upcasts q and k to fp32 and makes q·cos, the rotated
    # half (a cat) and its product with sin, then the same for k with q's fp32 result alive: six fp32 h-wide
    # tensors beside the residual and the fused qkv output (apply_rotary_pos_emb_vision,
    # modeling_qwen2_5_vl.py:200-210); or the MLP's gate, up and activation
    # (the block's normed input stays referenced while its attention runs: the residual, the normed input and the
    # qkv output are 5 compute-dtype h-wide tensors); and cos and sin, fp32, all along the tower's forward
    h, f, d = tower.hidden_size, tower.intermediate_size, tower.hidden_size // tower.num_heads
    fwd = n * (max((5 * c + 24) * h, c * 2 * h + 3 * c * f) + 2 * 4 * d)
    # NOTE: QLoRA after prepare_model_for_kbit_training: the RMSNorm weights are fp32 (peft/utils/other.py:205-209),
    # so ``self.weight * hidden_states.to(input_dtype)`` (modeling_qwen2_5_vl.py:79) makes an fp32 normed input,
    # and ``Linear4bit.forward`` casts its output back to its input's dtype (bitsandbytes/nn/modules.py:626-637):
    # qkv, the MLP and, from the second block on, the residual are fp32. q and k are fp32 already, so rotary makes
    # no ``.float()`` copies: four fp32 h-wide temporaries (q_embed, and k's product with cos, rotate_half's cat
    # and its product with sin). The Conv3d's weight is fp32 too: ``.to(dtype=target_dtype)`` on the fp32 pixels
    # is no copy (modeling_qwen2_5_vl.py:117-121)
    kbit = fp32_tower and not is_qwen3
    if kbit:
        fwd = n * (max((5 * 4 + 16) * h, 4 * 2 * h + 3 * 4 * f) + 2 * 4 * d)
    if in_path:  # the residual, the normed input, qkv and the tables are saved already: the fp32 rotary temporaries
        fwd = n * 24 * h
    if is_siglip:
        fwd = siglip.forward_transient(tower, n, vdt, in_path)
    if is_qwen3:
        fwd = qwen3.forward_transient(tower, n, vdt, in_path)
    if (is_siglip or is_qwen3) and setup.attention == "eager":
        # eager attention runs image by image (Qwen3-VL's blocks split q, k, v per image; SigLIP's batch is of
        # images, all at once): the s×s scores and their scaled copy (a each); then softmax(dtype=float32) of the
        # scaled scores, which converts a bf16 input to fp32 first (aten/src/ATen/native/SoftMax.cpp: only fp16
        # has half_to_float) beside its fp32 output (saved when gradients flow, else a transient), all beside the
        # block's residual, norm output, qkv output and rotated q and k (eager_attention_forward,
        # modeling_qwen3_vl.py:225-242 / modeling_siglip.py)
        # (the scaled scores stay bound until ``.to(query.dtype)`` has made the probabilities)
        half = (setup.autocast if vdt.autocast else setup.dtype) == "fp16"
        convert = 4 if c == 2 and not half else 0
        alone = 0 if in_path else max(4 + convert, 4 + (c if c != 4 else 0))  # the fp32 softmax, then the cast
        scores = tower.num_heads * grid.patches**2 * max(2 * c, c + convert, c + alone)
        if is_siglip:  # SigLIP's eager runs once over the batch of images: every image's scores at once
            scores *= images
        ln = 4 if vdt.autocast else vdt.residual
        held = 0 if in_path else n * (vdt.residual * h + ln * h + 5 * c * h)
        fwd = max(fwd, held + scores)
    every = setup.checkpoint_every if setup.checkpointing else 0
    by_span = {}
    for span in {s for _, s in spans}:
        acts = layer_activations(
            vspec, vsetup.with_(seq=span), vdt, base_trainable=trains, adapters=lora and not trains, group=None
        )
        per_block = round_alloc(n * acts.bytes_per_token) + acts.constant_bytes * (n // span)
        # proj saves the concatenation itself when its weight trains, or when lora_A reads it as it is (no autocast,
        # no cast to the adapters' dtype, no dropout: cabe.activations _Layer.linear_inputs)
        reads = "proj" in targets and not dt.autocast and dt.adapter_compute == dt.compute and setup.lora_dropout == 0
        per_block += 0 if is_siglip else qwen25.concatenated_output(tower, n, setup, dt, trains or reads)
        by_span[span] = (per_block, n * acts.backward_workspace_per_token)
    full_blocks = set(tower.full_attention_blocks)
    kept, whole, work, ckpts = [], [], [], []
    for j in range(tower.depth):  # transformers checkpoints the blocks whose index is a multiple of every_n_layers
        per_block, ws = by_span[spans[1][1] if j in full_blocks else spans[0][1]]
        ckpt = every > 0 and j % every == 0
        inp = 0 if setup.offload_activations else round_alloc(n * vdt.residual * h)
        kept.append((inp if ckpt else per_block) if in_path else 0)
        whole.append(per_block if in_path else 0)
        work.append(ws if in_path else 0)
        ckpts.append(ckpt)
    every_merger = any(lin.name in targets for lin in tower.merger_linears)
    if is_siglip:
        weight = dt.weight if trains else dt.frozen
        around = siglip.around(tower, n, dt, trains, weight) if in_path else 0
        pixel_copy = round_alloc(n * siglip.pixel_values(tower) * siglip.pixel_cast(dt, weight))
    elif is_qwen3:
        around = qwen3.around(tower, n, dt, trains, every_merger) if in_path else 0
        pixel_copy = round_alloc(n * patch_values(tower) * c)
        # the learned positions' gather and product, before any block has saved anything
        positions = qwen3.positions_transient(tower, n, dt.weight if trains else dt.frozen)
        fwd = max(fwd, positions - (sum(kept) + around))
    else:
        around = qwen25.around(tower, n, dt, trains, every_merger) if in_path else 0
        pixel_copy = 0 if kbit else round_alloc(n * patch_values(tower) * c)
    return TowerActivations(
        saved=sum(kept) + around,
        # beside the pixels' 16-bit cast (saved as the Conv3d's input when it trains)
        forward_transient=fwd + (0 if trains else pixel_copy),
        blocks=sum(kept),
        around=around,
        kept=tuple(kept),
        full=tuple(whole),
        workspace=tuple(work),
        checkpointed=tuple(ckpts),
    )


def with_images(
    parts: StepParts, spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, tensors: list[Tensor], bytes_of: dict[str, int]
) -> StepParts:
    """``parts`` with the images of ``setup`` (the ``vision_*`` fields of :class:`cabe.step.StepParts`).

    ``tensors`` / ``bytes_of``: the model states' parameter tensors and their bytes per element by kind. Under
    autocast with weights of another dtype (fp32, or bf16 under fp16 autocast), each matmul in the tower's
    gradient path saves its 16-bit cast of the weight until that block's backward (cached by autocast when the
    weight trains, cast anew otherwise): counted with what the tower saves."""
    grid = check_images(spec, setup.images, setup.image_size, setup.seq)
    tower = spec.vision
    if grid is None or tower is None:
        return parts
    acts = tower_activations(spec, setup, dt, grid)
    in_path = tower_in_path(spec, setup)
    cast = in_path and dt.autocast and dt.input_casts and setup.method != "qlora"
    block_copies = 2 * sum(lin.weight_count for lin in tower.block_linears) if cast else 0
    merger_copies = 2 * tower.mergers * sum(lin.weight_count for lin in tower.merger_linears) if cast else 0

    def grads(keep: str, count: int | None = None) -> int:
        return sum(
            round_alloc(t.numel * bytes_of[t.kind]) * (t.count if count is None else 1)
            for t in tensors
            if t.trainable and t.name.startswith(VISION_PREFIX + keep) and (count is None or t.count == count)
        )

    total, per_block, merger = grads(""), grads("", tower.depth), grads("merger")
    # the processor's pixel_values: an fp32 input of the step, alive until it ends
    pixels = round_alloc(setup.batch * setup.images * grid.patches * patch_values(tower) * 4)
    copies = merger_copies + sum(0 if ck else block_copies for ck in acts.checkpointed)
    saved = acts.saved + copies + pixels + _image_masks(spec, setup)
    # backward from the top block down: block j runs (recomputed whole when checkpointed) with the blocks below it
    # still saved; the gradients of the merger and of blocks j..top are made
    best = (0, 0, 0)
    below = acts.around + pixels + merger_copies
    below_kept = [0]
    for j in range(tower.depth):
        below_kept.append(below_kept[-1] + acts.kept[j] + (0 if acts.checkpointed[j] else block_copies))
    for j in range(tower.depth) if in_path else ():
        act_j = below + below_kept[j] + acts.full[j] + block_copies + acts.workspace[j]
        grads_j = merger + (tower.depth - j) * per_block
        if act_j + grads_j > best[0]:
            best = (act_j + grads_j, act_j, grads_j)
    return replace(
        parts,
        vision_saved=saved,
        vision_grads=total,
        vision_backward=best[1],
        vision_backward_grads=best[2],
        vision_forward=saved + acts.forward_transient,
    )


def _image_masks(spec: ModelSpec, setup: TrainingSetup) -> int:
    """The decoder's boolean masks of a model whose images attend both ways (Gemma 3's ``token_type_ids``:
    ``create_masks_for_vision_model`` builds a full and a sliding (batch, 1, seq, seq) mask, modeling_gemma3.py:
    682-744). They live through the decoder's forward; with checkpointing the checkpointed layers keep them (their
    saved inputs) until their backward: counted with what the tower keeps then. Without checkpointing they are
    gone before the loss (forward's top layer only: not counted)."""
    tower = spec.vision
    if tower is None or not tower.image_mask or not setup.checkpointing or setup.attention != "sdpa":
        return 0
    return 2 * round_alloc(setup.batch * setup.seq * setup.seq)
