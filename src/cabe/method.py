"""Training method: which parameters train, LoRA adapter sizes, and QLoRA 4-bit storage.

This module is also the LoRA parameter calculator: :func:`lora_parameters` gives the adapter
parameter count per target module, r × (in_features + out_features) for each adapted weight.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cabe import memo
from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.layers import LayerGroup, Linear
from cabe.training import TrainingSetup


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
    # a pure function of the model, the names and the group, asked for several times per estimate: once per model
    # (cabe.memo; the group by identity, kept alive by the entry; an error is raised again each time)
    if type(targets) is not tuple:
        return _lora_targets(spec, targets, group)
    m, key = memo.of(spec), ("lora_targets", targets, id(group))
    hit = m.get(key)
    if hit is None:
        hit = m[key] = (group, _lora_targets(spec, targets, group))
    return hit[1]


def _lora_targets(spec: ModelSpec, targets: tuple[str, ...], group: LayerGroup | None) -> tuple[Linear, ...]:
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
    # PEFT targets parameters under these names instead, and leaves their nn.Linear modules alone unless it keeps
    # the name on them too (kept_targets: a shared expert's / dense MLP's gate_proj, up_proj, down_proj)
    wanted -= moved_targets(spec, targets) - kept_targets(spec, targets)
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


def _converted_names(spec: ModelSpec, targets: tuple[str, ...]) -> frozenset[str]:
    """The names of ``targets`` PEFT's MoE conversion reads for this model type (``_MOE_TARGET_MODULE_MAPPING``'s
    keys); ``all-linear`` resolves to every one of them (peft 0.22.0 utils/transformers_weight_conversion.py:370-374,
    ``_resolve_string_target_modules``: the linears' names plus the mapping's keys)."""
    names = {old for old, _ in spec.peft_parameter_targets}
    if not names:
        return frozenset()
    chosen = set(targets or spec.peft_default_targets)
    return frozenset(names if "all-linear" in chosen else chosen & names)


def kept_targets(spec: ModelSpec, targets: tuple[str, ...]) -> frozenset[str]:
    """The converted names (:func:`_converted_names`) PEFT keeps as module targets: every module the name matches
    is an ``nn.Linear`` (peft 0.22.0 utils/transformers_weight_conversion.py:492-503, PEFT #3711 / #3945): the
    shared expert's and the dense MLPs' gate_proj / up_proj / down_proj. A name that matches no module (Mixtral's
    w1 / w2 / w3, Qwen3-MoE's expert names) or a non-Linear one (the router ``gate``, a ``TopKRouter``) is not
    kept. PEFT 0.21.2 kept none (its ``_convert_peft_config_moe`` moved every such name off ``target_modules``)."""
    converted = _converted_names(spec, targets)
    if not converted:
        return frozenset()
    by_name = {lin.name: lin for lin in spec.layer_linears}
    # the router module is named like the target (``gate``) but is no nn.Linear; cabe names its weight's Linear
    # after the parameter PEFT wraps (``gate`` for Qwen / DeepSeek, ``router`` for Mixtral), role "router"
    routers = {old for old, p in spec.peft_parameter_targets if p in by_name and by_name[p].role == "router"}
    linears = set(spec.linear_names)
    return frozenset(n for n in converted if n in linears and n not in routers)


def moved_targets(spec: ModelSpec, targets: tuple[str, ...]) -> frozenset[str]:
    """The target names PEFT turns into parameter targets (bare parameters it wraps) for this model type.

    PEFT 0.22.0 (tuners/tuners_utils.py ``inject_adapter`` -> utils/transformers_weight_conversion.py:461-509,
    ``_convert_peft_config_moe``), for a model type transformers 5 converts from its v4 MoE layout (PEFT's copy of
    transformers' ``_MODEL_TO_CONVERSION_PATTERN``, qwen2_moe added at :46): every target named like a v4 expert
    projection or router (``_MOE_TARGET_MODULE_MAPPING``: gate, gate_proj, up_proj, down_proj; Mixtral's gate,
    w1, w3, w2) joins ``target_parameters`` as its fused parameter, unless every module it matches is an
    ``nn.Linear`` (:func:`kept_targets`: then it stays a module target, and joins the parameters too only where a
    non-Linear module holds a parameter of the new name, :500-503: the fused experts beside DeepSeek-V3's, Qwen2-MoE's
    or Qwen3-Next's shared expert)."""
    converted = _converted_names(spec, targets)
    kept = kept_targets(spec, targets)
    if not kept:
        return converted
    bare = {lin.name for lin in spec.layer_linears if not lin.is_module}
    params = dict(spec.peft_parameter_targets)
    return frozenset(n for n in converted if n not in kept or params[n] in bare)


def lora_parameter_targets(
    spec: ModelSpec, targets: tuple[str, ...], group: LayerGroup | None = None
) -> tuple[tuple[Linear, int], ...]:
    """The bare parameters of one layer of ``group`` that PEFT wraps in a ``ParamWrapper`` (tuners/lora/layer.py
    0.21.2), each with its rank multiplier: a 3-D expert stack of E experts gets lora_A (r·E × in) and lora_B
    (out × r·E); a fused parameter reached from two names (gate_proj and up_proj -> gate_up_proj) gets twice the
    rank (``rank_pattern``: ``r * len(required_old_targets)``), and naming only one of them is refused."""
    if type(targets) is not tuple:
        return _lora_parameter_targets(spec, targets, group)
    m, key = memo.of(spec), ("lora_parameter_targets", targets, id(group))  # once per model, as lora_targets
    hit = m.get(key)
    if hit is None:
        hit = m[key] = (group, _lora_parameter_targets(spec, targets, group))
    return hit[1]


def _lora_parameter_targets(
    spec: ModelSpec, targets: tuple[str, ...], group: LayerGroup | None
) -> tuple[tuple[Linear, int], ...]:
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
        # (``copies``: transformers 4's per-expert modules, one adapter pair each, cabe.transformers_line)
        sized = [
            (lin, rank * (lin.in_features + lin.out_features) * lin.copies) for lin in lora_targets(spec, targets, run)
        ]
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
