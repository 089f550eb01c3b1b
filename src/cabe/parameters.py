"""The parameter tensors of a model under a training method (:func:`parameter_tensors`): per run of layers, the
base linears (trained, frozen or 4-bit), norms, embeddings, lm_head, the adapters LoRA / DoRA / prompt tuning add, the
bare parameters PEFT wraps, the vision tower's; each tensor's stored bytes per element (:func:`stored_bytes`) and
bitsandbytes' 4-bit storage (:func:`quantized_bytes`: one absmax per block of 64, double quantization). Which linears
are adapted is :mod:`cabe.method`'s. Proved by tests/test_estimate.py, tests/test_kbit_prep.py,
tests/test_modules_to_save.py and tests/trace/test_exactness.py (trainable counts against PEFT)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.layers import LayerGroup, Linear
from cabe.method import (
    VISION_PREFIX,
    adapter_learns,
    adapter_runs,
    checked_head_targets,
    lora_parameter_targets,
    lora_targets,
    saved_modules,
    vision_lora_targets,
    wrapped_adapter_sizes,
)
from cabe.tensors import Tensor
from cabe.training import TrainingSetup
from cabe.vision.tower import VisionTower

#: bitsandbytes 4-bit: one absmax per block of 64 weights; double quantization stores those
#: absmax values as 8-bit with one fp32 scale per 256 of them (Dettmers et al., QLoRA §3).
QUANT_BLOCK = 64


DOUBLE_QUANT_BLOCK = 256


QUANT_CODE_BYTES = 16 * 4  # the 16-entry NF4/FP4 code book, fp32


DOUBLE_QUANT_CODE_BYTES = 256 * 4  # the 8-bit dynamic code for the absmax values


def quantized_bytes(numel: int, double_quant: bool) -> int:
    """bitsandbytes 4-bit storage of one weight of ``numel`` elements, in bytes.

    packed weights numel/2 + absmax (fp32 per 64, or 8-bit per 64 + fp32 per 256×64 with double
    quantization) + code books. Per parameter: 0.5 + 4/64 = 0.5625 B, or 0.5 + 1/64 + 4/(64·256)
    ≈ 0.5159 B with double quantization.
    """
    packed = (numel + 1) // 2
    blocks = -(-numel // QUANT_BLOCK)
    if double_quant:
        blocks2 = -(-blocks // DOUBLE_QUANT_BLOCK)
        # absmax uint8 + absmax2 fp32 + nested code + offset (fp32 scalar)
        state = blocks + 4 * blocks2 + DOUBLE_QUANT_CODE_BYTES + 4
    else:
        state = 4 * blocks
    return packed + state + QUANT_CODE_BYTES


class _TensorList:
    """The tensors a listing builds, one :meth:`add` per tensor (a zero count or size adds nothing). With ``merge``,
    the same tensor met again in another run of the same kind of layer (dense, MoE, dense ...) adds to the first
    entry's count rather than making a second entry."""

    def __init__(self, *, merge: bool) -> None:
        self.tensors: list[Tensor] = []
        self._index: dict[tuple[Any, ...], int] | None = {} if merge else None

    def add(
        self,
        name: str,
        numel: int,
        count: int,
        trainable: bool,
        kind: str,
        rows: int = 0,
        cols: int = 0,
        role: str = "",
        path: str = "",
        stack: int = 1,
    ) -> None:
        if not (numel and count):
            return
        if self._index is not None:
            key = (name, numel, trainable, kind, rows, cols, role, path, stack)
            if key in self._index:
                t = self.tensors[self._index[key]]
                self.tensors[self._index[key]] = replace(t, count=t.count + count)
                return
            self._index[key] = len(self.tensors)
        self.tensors.append(Tensor(name, numel, count, trainable, kind, rows, cols, role, path, stack))


def parameter_tensors(spec: ModelSpec, setup: TrainingSetup) -> list[Tensor]:
    """Every parameter tensor (grouped), marked trainable or frozen for the setup's method.

    The decoder layers' tensors come run by run (:attr:`ModelSpec.runs`, bottom first), each run split
    into its frozen and trained layers (freeze trains the top ``trainable_layers``).
    """
    method = setup.method
    layers = spec.num_layers
    frozen_base = method in ("lora", "qlora", "prompt-tuning")
    out = _TensorList(merge=True)
    add = out.add

    if method == "freeze":
        parts = spec.top_split(min(setup.trainable_layers, layers))
    else:
        parts = tuple((run, run.count, not frozen_base) for run in spec.runs)
    emb_trainable = method == "full"
    add("embed_tokens", spec.embedding_count, 1, emb_trainable, "embedding", spec.vocab_size, spec.hidden_size)
    add(
        "position_embeddings",
        spec.position_embedding_count,
        1,
        emb_trainable,
        "embedding",
        spec.max_positions,
        spec.hidden_size,
    )
    add(
        "token_type_embeddings",
        spec.token_type_count,
        1,
        emb_trainable,
        "embedding",
        spec.token_types,
        spec.hidden_size,
    )
    for run, count, trainable in parts:
        _layer_tensors(add, spec, run, count, trainable, method == "qlora")
    add(
        "final_norm",
        spec.hidden_size,
        2 if spec.norm_bias else 1,
        method == "full",
        "fp32" if spec.fp32_norms else "norm",
    )
    if spec.fp32_head_parameters:  # DeepSeek-V4's hc_head: hc_fn (n × n·h), hc_base (n), hc_scale (1), fp32
        n = spec.hyper_connections
        for part, numel in (("hc_fn", n * n * spec.hidden_size), ("hc_base", n), ("hc_scale", 1)):
            add(f"hc_head.{part}", numel, 1, method == "full", "fp32")
    add("lm_head", spec.lm_head_count, 1, method == "full", "lm_head", spec.vocab_size, spec.hidden_size)
    for ht in saved_modules(spec, setup):  # the trainable copies (the originals above stay, frozen)
        add(
            f"{ht.name}.modules_to_save",
            spec.vocab_size * spec.hidden_size,
            1,
            True,
            ht.kind,
            spec.vocab_size,
            spec.hidden_size,
        )
    # NOTE: a vision tower (Gemma 3's SigLIP + projector) on text-only batches never runs, so it gets no
    # gradient and AdamW no state for it (torch/optim/adamw.py _init_group skips p.grad is None): frozen weights
    if spec.vision is not None:
        _vision_tensors(add, spec, spec.vision, setup)
    else:
        quantized_vision = spec.vision_linear_parameters if method == "qlora" else 0
        add("vision_tower", spec.vision_parameters - quantized_vision, 1, False, "base")
        add("vision_tower.linear", quantized_vision, 1, False, "quantized")  # QLoRA: bitsandbytes' 4-bit layers
    if spec.classifier_count:  # BertForSequenceClassification: pooler.dense and classifier, with biases
        h, n = spec.hidden_size, spec.num_labels
        add("pooler", h * h, 1, method == "full", "lm_head", h, h)
        add("pooler.bias", h, 1, method == "full", "lm_head")
        add("classifier", n * h, 1, method == "full", "lm_head", n, h)
        add("classifier.bias", n, 1, method == "full", "lm_head")
    if setup.adapters:
        r = setup.lora_rank
        for run in spec.runs:
            for lin in lora_targets(spec, setup.lora_targets, run):
                a_path, b_path = linear_path(spec, lin, ".lora_A"), linear_path(spec, lin, ".lora_B")
                runs = adapter_runs(run, lin) and adapter_learns(lin)  # (False: trainable, never given a gradient)
                # one adapter pair per module: ``copies`` of them for transformers 4's per-expert nn.Linear
                n = run.count * lin.copies
                add(lin.name + ".lora_A", r * lin.in_features, n, runs, "adapter", r, lin.in_features, path=a_path)
                add(lin.name + ".lora_B", lin.out_features * r, n, runs, "adapter", lin.out_features, r, path=b_path)
                if setup.dora:  # DoRA's magnitude ‖W + sBA‖ per output row (peft tuners/lora/dora.py:127,
                    # an adapter layer name, variants.py:143): the adapters' dtype, trained
                    add(lin.name + ".lora_magnitude_vector", lin.out_features, n, runs, "adapter")
            _wrapped_adapters(add, spec, setup, run, run.count)

        for ht in checked_head_targets(spec, setup):
            add(ht.name + ".lora_A", r * ht.in_features, 1, True, "adapter", r, ht.in_features)
            add(ht.name + ".lora_B", ht.out_features * r, 1, True, "adapter", ht.out_features, r)
    if method == "prompt-tuning":
        add(
            "prompt_embeddings",
            setup.prompt_tokens * spec.hidden_size,
            1,
            True,
            "prompt",
            setup.prompt_tokens,
            spec.hidden_size,
        )
    return out.tensors


def _vision_tensors(add: Any, spec: ModelSpec, tower: VisionTower, setup: TrainingSetup) -> None:
    """The tower's tensors (``model.visual``): trained by ``full`` when images run through it (text-only batches
    never run it: no gradient, no optimizer state), frozen otherwise; its linears 4-bit under QLoRA
    (transformers' bitsandbytes integration replaces every module whose type is exactly ``nn.Linear``,
    integrations/bitsandbytes.py:189, but those of ``get_keys_to_not_convert`` -- the output embedding, tied
    weights and the last parameter's module, quantizers/base.py:39-63, 5.24 -- none of which is in a tower: the
    blocks', the mergers' and SigLIP's head MLP; the Conv2d / Conv3d patch embeddings, the norms, the positions
    and Gemma 3's bare projector matrix stay, fp32 after ``prepare_model_for_kbit_training``); LoRA adapters on
    the linears PEFT matches (:func:`vision_lora_targets`), trained when images run."""
    trains = setup.method == "full" and setup.images > 0
    quantize = setup.method == "qlora"
    v = VISION_PREFIX
    h = tower.hidden_size
    for name, numel, count, kind in tower.around_tensors:
        if name == "norm" or not numel * count:
            continue  # (the norms after the linears, as before)
        rows = h if name in ("patch_embed", "projector") else 0
        # SigLIP's head runs but its output is dropped (Gemma3Model.get_image_features keeps the last hidden state):
        # never a gradient
        learns = trains and not name.startswith("head")
        if quantize and name in tower.around_linears:  # (SigLIP's head MLP: nn.Linear, 4-bit like the blocks')
            add(v + name, numel, count, False, "quantized")
            continue
        add(v + name, numel, count, learns, kind, *((rows, numel // rows) if rows else ()))
    blocks = [(lin, tower.depth, False) for lin in tower.block_linears]
    for lin, count, merger in blocks + [(lin, tower.mergers, True) for lin in tower.merger_linears]:
        name = v + ("merger.mlp." if merger else "") + lin.name
        if quantize:
            add(name, lin.weight_count, count, False, "quantized", role=lin.role)
        else:
            rows, cols = lin.out_features, lin.in_features
            path = _vision_path(lin, 1 if merger else count)
            add(name, lin.weight_count, count, trains, "base", rows, cols, role=lin.role, path=path)
        add(name + ".bias", lin.out_features, count, trains, "base", role=lin.role)
    add(v + "norm", h, 2 * tower.depth + 1, trains, "norm")
    r = setup.lora_rank
    for lin, count in vision_lora_targets(spec, setup):
        merger = lin in tower.merger_linears and (lin not in tower.block_linears)
        name = v + ("merger.mlp." if merger and tower.kind == "qwen3_vl" else "") + lin.name
        adapters = setup.images > 0
        path = _vision_path(lin, 1 if merger else count)
        a_path, b_path = path + ".lora_A", path + ".lora_B"
        add(name + ".lora_A", r * lin.in_features, count, adapters, "adapter", r, lin.in_features, path=a_path)
        add(name + ".lora_B", lin.out_features * r, count, adapters, "adapter", lin.out_features, r, path=b_path)


def _vision_path(lin: Linear, count: int) -> str:
    """A tower linear's module path as transformers names it (``visual.blocks.N.attn.qkv``, ``visual.merger.mlp.0``)
    without the block's number: what GaLore's ``optim_target_modules`` match as substrings ("attn", "mlp")."""
    if lin.name in ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"):  # SigLIP's (vision_tower.encoder...)
        return "vision_tower.encoder.layers." + ("mlp." if lin.role == "mlp" else "self_attn.") + lin.name
    if count == 1:
        return "visual.merger." + ("" if lin.name.startswith("linear_") else "mlp.") + lin.name
    return "visual.blocks." + ("mlp." if lin.role == "mlp" else "attn.") + lin.name


def layer_tensors(spec: ModelSpec, setup: TrainingSetup, run: LayerGroup, trainable: bool) -> list[Tensor]:
    """The tensors of ONE layer of ``run`` as :func:`parameter_tensors` lists them (its base weights
    trainable or not, and its LoRA adapters)."""
    out = _TensorList(merge=False)
    add = out.add

    _layer_tensors(add, spec, run, 1, trainable and setup.method in ("full", "freeze"), setup.method == "qlora")
    if setup.adapters:
        r = setup.lora_rank
        for lin in lora_targets(spec, setup.lora_targets, run):
            a_path, b_path = linear_path(spec, lin, ".lora_A"), linear_path(spec, lin, ".lora_B")
            runs = adapter_runs(run, lin) and adapter_learns(lin)
            n = lin.copies  # (transformers 4's per-expert modules: one adapter pair each)
            add(lin.name + ".lora_A", r * lin.in_features, n, runs, "adapter", r, lin.in_features, lin.role, a_path)
            add(lin.name + ".lora_B", lin.out_features * r, n, runs, "adapter", lin.out_features, r, lin.role, b_path)
            if setup.dora:
                add(lin.name + ".lora_magnitude_vector", lin.out_features, n, runs, "adapter", role=lin.role)
        _wrapped_adapters(add, spec, setup, run, 1)
    return out.tensors


def _wrapped_adapters(add: Any, spec: ModelSpec, setup: TrainingSetup, run: LayerGroup, count: int) -> None:
    """The LoRA matrices of the bare parameters PEFT wraps (:func:`lora_parameter_targets`). PEFT refuses to wrap
    them with a LoRA dropout ("lora.ParamWrapper does not work with lora_dropout != 0", peft/tuners/lora/layer.py
    0.21.2, ``ParamWrapper.__init__`` and ``update_layer``: dropout cannot be factored out of lora_B(lora_A(x)) when
    x is not the layer's input): so does cabe."""
    wrapped = lora_parameter_targets(spec, setup.lora_targets, run)
    if wrapped and setup.dora:  # "lora.ParamWrapper does not work with use_dora=True." (the same __init__)
        raise InvalidValueError("dora_wrapped", "dora", targets=", ".join(lin.name for lin, _ in wrapped))
    if wrapped and setup.lora_dropout > 0:
        raise InvalidValueError(
            "lora_dropout_wrapped",
            "lora_dropout",
            value=setup.lora_dropout,
            targets=", ".join(lin.name for lin, _ in wrapped),
        )
    for lin, mult in wrapped:
        na, nb = wrapped_adapter_sizes(lin, setup.lora_rank, mult)
        rank = setup.lora_rank * mult * lin.copies
        add(lin.name + ".lora_A", na, count, True, "adapter", rank, lin.in_features, lin.role)
        add(lin.name + ".lora_B", nb, count, True, "adapter", lin.out_features, rank, lin.role)


def _layer_tensors(add: Any, spec: ModelSpec, run: LayerGroup, count: int, trainable: bool, quantize: bool) -> None:
    """The tensors of ``count`` layers of ``run``: its linears (4-bit under QLoRA), biases and norms."""
    for lin in run.linears:
        if quantize and lin.quantized_by_bnb:
            add(lin.name, lin.in_features * lin.out_features * lin.copies, count, False, "quantized", role=lin.role)
        else:
            rows, cols = lin.out_features, lin.in_features
            add(
                lin.name,
                lin.in_features * lin.out_features,
                count * lin.copies,
                trainable and adapter_learns(lin),  # (DeepSeek-V3.2's and V4's indexers: never given a gradient)
                "fp32" if lin.fp32 else "base",
                rows,
                cols,
                role=lin.role,
                path=linear_path(spec, lin),
                stack=lin.copies,
            )
        if lin.bias:
            add(
                lin.name + ".bias",
                lin.out_features,
                count * lin.copies,
                trainable and adapter_learns(lin),
                "base",
                role=lin.role,
                stack=lin.copies,
            )
    add(
        "norm",
        spec.norm_param_count // (2 if spec.norm_bias else 1),
        count * spec.norms_per_layer * (2 if spec.norm_bias else 1),
        trainable,
        "fp32" if spec.fp32_norms else "norm",
    )
    if run.mixer != "attention":  # a linear-attention layer: no q / k norms (its gated norm is a mixer parameter)
        return
    if spec.qk_norm == "head":
        add("qk_norm", spec.head_dim, 2 * count, trainable, "norm")
    elif spec.qk_norm == "full":
        add("q_norm", spec.q_dim, count, trainable, "norm")
        add("k_norm", spec.kv_dim, count, trainable, "norm")
    if spec.latent_attention:  # multi-head latent attention's q_a_layernorm and kv_a_layernorm
        add("q_a_layernorm", spec.latent_attention.q_lora_rank, count, trainable, "norm")
        add("kv_a_layernorm", spec.latent_attention.kv_lora_rank, count, trainable, "norm")
        if spec.latent_attention.index_heads:  # DeepSeek-V3.2's indexer.k_norm, an nn.LayerNorm: weight and bias
            # (under the indexer's torch.no_grad, like its linears: never given a gradient, see adapter_learns)
            add("indexer.k_norm", spec.latent_attention.index_head_dim, 2 * count, False, "norm")


def linear_path(spec: ModelSpec, lin: Linear, suffix: str = "") -> str:
    """``lin``'s module path in its layer (``self_attn.q_proj``), or "" when it is no ``nn.Linear``: a bare
    parameter (fused experts, some routers) or GPT-2's Conv1D (its LoRA matrices are nn.Linear: ``suffix``)."""
    if not lin.is_module or (spec.conv1d and not suffix):
        return ""
    return dict(spec.module_prefixes).get(lin.role, "") + lin.name + suffix


def stored_bytes(t: Tensor, setup: TrainingSetup, dt: Any) -> int:
    """Bytes per element of a parameter tensor as stored, for the setup's dtypes ``dt``.

    The one rule both the single-GPU estimate and the sharding plans use.
    """
    if t.kind == "adapter":
        return dt.adapter
    if t.kind == "prompt":
        return 4  # PEFT's prompt embeddings are fp32
    if t.kind == "fp32":
        return 4  # kept in fp32 by the model whatever its dtype (DeepSeek-V4: _keep_in_fp32_modules_strict)
    if t.kind in ("norm", "embedding", "lm_head") and setup.method == "qlora" and setup.kbit_prep:
        return 4  # prepare_model_for_kbit_training casts them to fp32
    return dt.weight if t.trainable else dt.frozen


def trainable_count(tensors: list[Tensor]) -> int:
    return sum(t.total for t in tensors if t.trainable)
