"""Training method: which parameters train, LoRA adapter sizes, and QLoRA 4-bit storage.

This module is also the LoRA parameter calculator: :func:`lora_parameters` gives the adapter
parameter count per target module, r × (in_features + out_features) for each adapted weight.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cabe.architecture import LayerGroup, Linear, ModelSpec, VisionTower
from cabe.errors import InvalidValueError
from cabe.tensors import Tensor
from cabe.training import TrainingSetup

#: bitsandbytes 4-bit: one absmax per block of 64 weights; double quantization stores those
#: absmax values as 8-bit with one fp32 scale per 256 of them (Dettmers et al., QLoRA §3).
QUANT_BLOCK = 64
DOUBLE_QUANT_BLOCK = 256
QUANT_CODE_BYTES = 16 * 4  # the 16-entry NF4/FP4 code book, fp32
DOUBLE_QUANT_CODE_BYTES = 256 * 4  # the 8-bit dynamic code for the absmax values


@dataclass(frozen=True)
class LoraTarget:
    name: str
    in_features: int
    out_features: int
    per_layer: int  # how many modules with this name in one layer
    parameters: int  # r*(in+out)*per_layer*num_layers


def lora_targets(spec: ModelSpec, targets: tuple[str, ...], group: LayerGroup | None = None) -> tuple[Linear, ...]:
    """The adapted weight matrices of one layer of ``group`` (of the model's first run when None), as
    PEFT matches ``target_modules``.

    ``all-linear`` matches every ``nn.Linear`` / ``Conv1D`` in the layers (PEFT excludes the output
    layer). Raises :class:`InvalidValueError` for a name no layer of the model has.
    """
    names = spec.linear_names
    if not targets:
        targets = spec.peft_default_targets  # PEFT's default for the model type (the family module's)
    # ``all-linear`` beside other names (``all-linear,lm_head``) means every linear layer and those: PEFT reads the
    # shorthand only as the whole target_modules string (peft/tuners/tuners_utils.py 0.21.2,
    # _maybe_include_all_linear_layers), so the trace expands it with that function before adding the others
    # (cabe.trace.build._all_linear_and)
    broken = [n for n in spec.lora_breaks if n in targets or "all-linear" in targets]
    if broken:
        raise InvalidValueError("lora_target_breaks", "lora_targets", value=", ".join(broken))
    refused = [n for n in spec.lora_unsupported if n in targets]
    if refused:  # PEFT raises on the whole config (ModelSpec.lora_unsupported)
        raise InvalidValueError("lora_target_unsupported", "lora_targets", value=", ".join(refused))
    if any(t == "all-linear" for t in targets):
        wanted = set(names)
    else:
        # (and the names PEFT moves onto bare parameters: a MoE router's ``gate``, Mixtral's v4 ``w1``...)
        heads = head_module_names(spec)
        known = list(names) + list(heads) + [old for old, _ in spec.peft_parameter_targets if old not in names]
        unknown = [t for t in targets if t not in known]
        # PEFT refuses target_modules only when none of them matches (tuners_utils.py inject_adapter: "Target
        # modules ... not found in the base model"); one that matches nothing beside others that do is dropped
        # without a word: cabe drops it too, with a note naming it (lora_target_unmatched, unmatched_lora_targets)
        if unknown and len(unknown) == len(targets):
            raise InvalidValueError(
                "unknown_lora_target",
                "lora_targets",
                value=", ".join(unknown),
                allowed=", ".join(known) + ", all-linear",
            )
        wanted = set(targets)
    wanted -= moved_targets(spec, targets)  # PEFT targets parameters under these names instead
    layer = spec.runs[0] if group is None else group
    return tuple(lin for lin in layer.linears if lin.is_module and lin.name in wanted)


def unmatched_lora_targets(spec: ModelSpec, targets: tuple[str, ...]) -> tuple[str, ...]:
    """The names of ``targets`` no module of the model has, given beside names it has (PEFT adapts those and
    drops these; :func:`lora_targets` refuses a list where none matches)."""
    if not targets or "all-linear" in targets:
        return ()
    heads = head_module_names(spec)
    known = set(spec.linear_names) | set(heads) | {old for old, _ in spec.peft_parameter_targets}
    unknown = tuple(t for t in targets if t not in known)
    return unknown if len(unknown) < len(targets) else ()


def moved_targets(spec: ModelSpec, targets: tuple[str, ...]) -> frozenset[str]:
    """The target names PEFT moves off ``nn.Linear`` modules onto bare parameters for this model type.

    PEFT 0.21.2 (tuners/tuners_utils.py ``inject_adapter`` -> utils/transformers_weight_conversion.py
    ``_convert_peft_config_moe``), for a model type transformers 5 converts from its v4 MoE layout: every target
    named like a v4 expert projection or router (``_MOE_TARGET_MODULE_MAPPING``: gate, gate_proj, up_proj,
    down_proj) leaves ``target_modules`` — so no ``nn.Linear`` of that name is adapted any more, the dense and
    shared-expert MLPs included — and its fused parameter joins ``target_parameters``. ``all-linear`` resolves
    to the attention's linears plus every one of those names (``_resolve_string_target_modules``)."""
    names = {old for old, _ in spec.peft_parameter_targets}
    if not names:
        return frozenset()
    chosen = set(targets or spec.peft_default_targets)
    return frozenset(names if "all-linear" in chosen else chosen & names)


def lora_parameter_targets(
    spec: ModelSpec, targets: tuple[str, ...], group: LayerGroup | None = None
) -> tuple[tuple[Linear, int], ...]:
    """The bare parameters of one layer of ``group`` that PEFT wraps in a ``ParamWrapper`` (tuners/lora/layer.py
    0.21.2), each with its rank multiplier: a 3-D expert stack of E experts gets lora_A (r·E × in) and lora_B
    (out × r·E); a fused parameter reached from two names (gate_proj and up_proj -> gate_up_proj) gets twice the
    rank (``rank_pattern``: ``r * len(required_old_targets)``), and naming only one of them is refused."""
    moved = moved_targets(spec, targets)
    if not moved:
        return ()
    by_param: dict[str, set[str]] = {}
    for old, param in spec.peft_parameter_targets:
        by_param.setdefault(param, set()).add(old)
    for olds in by_param.values():
        if 0 < len(olds & moved) < len(olds):
            raise InvalidValueError(
                "fused_lora_target",
                "lora_targets",
                value=", ".join(sorted(olds & moved)),
                allowed=", ".join(sorted(olds)),
            )
    layer = spec.runs[0] if group is None else group
    out = []
    for lin in layer.linears:
        olds = by_param.get(lin.name, set())
        if olds and olds <= moved:
            out.append((lin, len(olds)))
    return tuple(out)


def wrapped_adapter_sizes(lin: Linear, rank: int, multiplier: int) -> tuple[int, int]:
    """(lora_A, lora_B) element counts of a ``ParamWrapper`` around ``lin`` (``update_layer``:
    ``nn.Linear(in, r·E)`` and ``nn.Linear(r·E, out)``)."""
    r = rank * multiplier * lin.copies
    return r * lin.in_features, r * lin.out_features


def head_module_names(spec: ModelSpec) -> tuple[str, ...]:
    """The modules outside the layers LoRA may target: the token embedding and, over a vocabulary, the
    lm_head (``all-linear`` takes neither: PEFT leaves the output layer out, tuners_utils.py
    ``_maybe_include_all_linear_layers``, and matches ``nn.Linear`` / ``Conv1D`` only)."""
    return (spec.embedding_name, spec.lm_head_name) if spec.head == "lm" else (spec.embedding_name,)


@dataclass(frozen=True)
class HeadTarget:
    """A LoRA adapter on the token embedding (``kind`` "embedding": peft tuners/lora/layer.py ``Embedding``,
    ``lora_embedding_A`` r × vocab, ``lora_embedding_B`` hidden × r) or on the lm_head (``kind`` "lm_head": a
    ``Linear``, lora_A r × hidden, lora_B vocab × r): r · (in + out) parameters either way."""

    name: str
    kind: str
    in_features: int
    out_features: int


def head_targets(spec: ModelSpec, targets: tuple[str, ...]) -> tuple[HeadTarget, ...]:
    """The embedding / lm_head adapters ``targets`` names (validated by :func:`lora_targets`). A tied lm_head
    is still its own module: PEFT wraps it apart from the embedding (the adapters are not tied)."""
    h, v = spec.hidden_size, spec.vocab_size
    out = []
    if spec.embedding_name in targets:
        out.append(HeadTarget(spec.embedding_name, "embedding", v, h))
    if spec.head == "lm" and spec.lm_head_name in targets:
        out.append(HeadTarget(spec.lm_head_name, "lm_head", h, v))
    return tuple(out)


def checked_head_targets(spec: ModelSpec, setup: TrainingSetup) -> tuple[HeadTarget, ...]:
    """:func:`head_targets` of a setup, refusing what cabe does not model on them: DoRA (its embedding variant
    and the weight norm of a vocabulary-wide lm_head, peft tuners/lora/variants.py) and, on the lm_head, a loss
    other than transformers' own (the fused and chunked losses read the lm_head's weight or call it by chunks)."""
    found = head_targets(spec, setup.lora_targets) if setup.adapters else ()
    if found and setup.dora:
        raise InvalidValueError("lora_head_dora", "dora", value=", ".join(t.name for t in found))
    lm_head = [t.name for t in found if t.kind == "lm_head"]
    if lm_head and setup.resolved_loss != "hf":
        raise InvalidValueError("lora_head_loss", "loss", value=setup.resolved_loss, target=lm_head[0])
    return found


def saved_modules(spec: ModelSpec, setup: TrainingSetup) -> tuple[HeadTarget, ...]:
    """The modules ``modules_to_save`` trains whole beside the adapters: PEFT's ``ModulesToSaveWrapper`` (peft 0.21.2
    utils/other.py:632-663) keeps the original frozen and deep-copies it into a trainable module that the forward
    uses (``_forward_wrapped``); ``cast_adapter_dtype`` leaves the copy in the original's dtype (it casts only
    ``BaseTunerLayer`` parameters, tuners_utils.py:2705-2745). cabe models the token embedding and the lm_head of a
    model whose two are not tied; another name, a module that is also a LoRA target (PEFT wraps it twice) or tied
    weights are typed errors."""
    if not setup.adapters or not setup.modules_to_save:
        return ()
    allowed = head_module_names(spec)
    unknown = [n for n in setup.modules_to_save if n not in allowed]
    if unknown:
        raise InvalidValueError(
            "modules_to_save_unknown", "modules_to_save", value=", ".join(unknown), allowed=", ".join(allowed)
        )
    adapted = [n for n in setup.modules_to_save if n in setup.lora_targets]
    if adapted:
        raise InvalidValueError("modules_to_save_adapted", "modules_to_save", value=", ".join(adapted))
    if spec.tie_word_embeddings:
        raise InvalidValueError("modules_to_save_tied", "modules_to_save", value=", ".join(setup.modules_to_save))
    copy = setup.compute_dtype if setup.method == "qlora" and not setup.kbit_prep else setup.dtype
    if setup.method == "qlora" and setup.kbit_prep:
        copy = "fp32"  # a copy of prepare_model_for_kbit_training's fp32 module
    if copy == "fp16" and setup.autocast == "fp16":
        # the copy trains in fp16: torch.amp.GradScaler.unscale_ refuses fp16 gradients ("Attempting to unscale
        # FP16 gradients", traced: qwen3-8b LoRA fp16 under fp16 autocast with embed_tokens saved)
        raise InvalidValueError("fp16_weights_fp16_autocast", "autocast", value="fp16", dtype="fp16")
    return head_targets(spec, setup.modules_to_save)


def adapter_runs(run: LayerGroup, lin: Linear) -> bool:
    """Whether the LoRA adapter PEFT puts on ``lin`` ever runs. A Mamba-2 mixer's out_proj (slot ``o``) is
    multiplied inside mamba-ssm's fused kernel, which takes ``out_proj.weight`` — the base weight — and never calls
    the module (transformers 5.24 ``GraniteMoeHybridMambaLayer.forward``): its adapter exists, gets no gradient and
    so no optimizer state (torch's optimizers skip parameters whose grad is None), and makes no cast."""
    return not (run.mixer == "mamba2" and lin.slot == "o")


def running_lora_targets(spec: ModelSpec, targets: tuple[str, ...], run: LayerGroup) -> tuple[Linear, ...]:
    """The adapted matrices of one layer of ``run`` whose adapter runs (:func:`adapter_runs`)."""
    return tuple(lin for lin in lora_targets(spec, targets, run) if adapter_runs(run, lin))


def lora_parameters(spec: ModelSpec, rank: int, targets: tuple[str, ...]) -> list[LoraTarget]:
    """Adapter parameters per target module name: rank × (in + out) per adapted matrix, summed over the
    layers that have it (``per_layer``: how many one layer of the first run that has it holds)."""
    out: dict[str, LoraTarget] = {}
    for run in spec.runs:
        in_run: dict[str, LoraTarget] = {}
        sized = [(lin, rank * (lin.in_features + lin.out_features)) for lin in lora_targets(spec, targets, run)]
        sized += [
            (lin, sum(wrapped_adapter_sizes(lin, rank, m))) for lin, m in lora_parameter_targets(spec, targets, run)
        ]
        for lin, size in sized:
            prev = in_run.get(lin.name)
            per = size * run.count
            if prev is None:
                in_run[lin.name] = LoraTarget(lin.name, lin.in_features, lin.out_features, 1, per)
            else:  # e.g. GPT-2's c_proj exists in attention and MLP
                in_run[lin.name] = replace(prev, per_layer=prev.per_layer + 1, parameters=prev.parameters + per)
        for name, tgt in in_run.items():
            prev = out.get(name)
            out[name] = tgt if prev is None else replace(prev, parameters=prev.parameters + tgt.parameters)
    for ht in head_targets(spec, targets):
        out[ht.name] = LoraTarget(
            ht.name, ht.in_features, ht.out_features, 0, rank * (ht.in_features + ht.out_features)
        )
    return list(out.values())


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


def parameter_tensors(spec: ModelSpec, setup: TrainingSetup) -> list[Tensor]:
    """Every parameter tensor (grouped), marked trainable or frozen for the setup's method.

    The decoder layers' tensors come run by run (:attr:`ModelSpec.runs`, bottom first), each run split
    into its frozen and trained layers (freeze trains the top ``trainable_layers``).
    """
    method = setup.method
    layers = spec.num_layers
    frozen_base = method in ("lora", "qlora", "prompt-tuning")
    tensors: list[Tensor] = []
    index: dict[tuple[Any, ...], int] = {}

    def add(
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
        key = (name, numel, trainable, kind, rows, cols, role, path, stack)
        if key in index:  # the same tensor in another run of the same kind of layer (dense, MoE, dense ...)
            t = tensors[index[key]]
            tensors[index[key]] = replace(t, count=t.count + count)
            return
        index[key] = len(tensors)
        tensors.append(Tensor(name, numel, count, trainable, kind, rows, cols, role, path, stack))

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
                add(
                    lin.name + ".lora_A",
                    r * lin.in_features,
                    run.count,
                    runs,
                    "adapter",
                    r,
                    lin.in_features,
                    path=a_path,
                )
                add(
                    lin.name + ".lora_B",
                    lin.out_features * r,
                    run.count,
                    runs,
                    "adapter",
                    lin.out_features,
                    r,
                    path=b_path,
                )
                if setup.dora:  # DoRA's magnitude ‖W + sBA‖ per output row (peft tuners/lora/dora.py:127,
                    # an adapter layer name, variants.py:143): the adapters' dtype, trained
                    add(lin.name + ".lora_magnitude_vector", lin.out_features, run.count, runs, "adapter")
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
    return tensors


def adapter_learns(lin: Linear) -> bool:
    """Whether LoRA adapters on ``lin`` (or ``lin`` itself, trained in full) ever get a gradient. DeepSeek-V3.2's
    indexer runs under ``torch.no_grad`` (transformers 5.24 models/deepseek_v32/modeling_deepseek_v32.py:178,
    ``DeepseekV32Indexer.forward``): PEFT wraps its wq_b, wk and weights_proj (all-linear, or by name) and marks the
    adapters trainable, and full training leaves its own weights requiring grad, but their ``.grad`` stays None, so
    no gradient is made and the optimizers, which skip parameters without one (torch 2.13 torch/optim/adam.py:151,
    ``_init_group``: ``if p.grad is not None``), never make their state. cabe holds them as frozen. (A tiny
    V3.2 under bf16-amp: 168,960 indexer parameters, 1.35 MB of AdamW state the trace never makes.) DeepSeek-V4's
    indexer (``DeepseekV4Indexer.forward``) returns integer top-k indices: no gradient reaches its weights either."""
    return lin.slot != "indexer"


#: the prefix of the vision tower's tensors (transformers' ``model.visual``)
VISION_PREFIX = "visual."


def vision_lora_targets(spec: ModelSpec, setup: TrainingSetup) -> tuple[tuple[Linear, int], ...]:
    """The tower's linears LoRA adapts, each with how many there are: PEFT 0.21.2 matches ``target_modules`` by
    the module's last name (tuners_utils.py ``check_target_module_exists``), so the decoder's ``gate_proj`` /
    ``up_proj`` / ``down_proj`` name the tower's MLP too, and ``all-linear`` takes every ``nn.Linear`` but the
    output layer (tuners_utils.py:2430-2490): the blocks' and the merger's."""
    tower = spec.vision
    if tower is None or not setup.adapters:
        return ()
    targets = set(setup.lora_targets or spec.peft_default_targets)
    every = "all-linear" in targets
    out = [(lin, tower.depth) for lin in tower.block_linears if every or lin.name in targets]
    # the merger's (and Qwen3-VL's DeepStack mergers'): Qwen2.5-VL's are named "0" and "2", Qwen3-VL's as its MLP's
    out += [(lin, tower.mergers) for lin in tower.merger_linears if every or lin.name in targets]
    return tuple(out)


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
    tensors: list[Tensor] = []

    def add(
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
        if numel and count:
            tensors.append(Tensor(name, numel, count, trainable, kind, rows, cols, role, path, stack))

    _layer_tensors(add, spec, run, 1, trainable and setup.method in ("full", "freeze"), setup.method == "qlora")
    if setup.adapters:
        r = setup.lora_rank
        for lin in lora_targets(spec, setup.lora_targets, run):
            a_path, b_path = linear_path(spec, lin, ".lora_A"), linear_path(spec, lin, ".lora_B")
            runs = adapter_runs(run, lin) and adapter_learns(lin)
            add(lin.name + ".lora_A", r * lin.in_features, 1, runs, "adapter", r, lin.in_features, lin.role, a_path)
            add(lin.name + ".lora_B", lin.out_features * r, 1, runs, "adapter", lin.out_features, r, lin.role, b_path)
            if setup.dora:
                add(lin.name + ".lora_magnitude_vector", lin.out_features, 1, runs, "adapter", role=lin.role)
        _wrapped_adapters(add, spec, setup, run, 1)
    return tensors


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
