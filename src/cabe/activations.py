"""Activation memory: the tensors autograd saves for backward, per token, per decoder layer.

Each :class:`Term` is one saved tensor (or a group of equal ones), with its size in bytes per
token and its formula in the config's symbols: h = hidden size, q = heads × head_dim,
kv = kv heads × head_dim, f = intermediate (MLP) size, nh = attention heads, s = sequence,
V = vocabulary, E = experts, k = experts per token, r = LoRA rank, a = bytes of the compute
dtype (2 for bf16/fp16, 4 for fp32), ρ = bytes of the residual stream (4 under autocast); in a Mamba-2 layer
(:mod:`cabe.ssm`) d_inner = its heads × head_dim, H = its heads, N = its state size, g = its groups.

Where the terms come from (each checked against saved-tensor hooks on transformers 5 models):

* RMSNorm (Llama family) upcasts its input to fp32 (4h, saved by ``pow``/``mul``), keeps the
  fp32 ``rsqrt`` per token (4), the normalised tensor cast back (ρh, saved by ``weight *`` only
  when the norm weight trains) and its output (saved by the next linear layer). Gemma's norm
  multiplies by (1 + w) in fp32, so its normalised tensor is fp32 (4h).
* A linear layer saves its input only when its weight trains (for the weight gradient); under
  autocast each linear saves its own 16-bit cast of the input (2·in).
* Attention (SDPA flash / memory-efficient, as CUDA picks): q and k after rotary, v, the output
  and the fp32 log-sum-exp (4·nh). Rotary saves nothing per layer (``q * cos`` keeps cos only).
  Eager attention saves the fp32 softmax (4·nh·s) and its cast (a·nh·s): quadratic in s.
* Gated MLP (SwiGLU / GeGLU): gate output, activation output, up output, and their product
  (saved by ``down_proj`` when it trains): 4·a·f. Plain MLP (GELU): 2·a·f (5·a·f for GPT-2's
  tanh-approximated gelu_new, which is a chain of element-wise ops).
* LoRA: ``lora_A`` saves its input — a fresh fp32 cast (4·in) per adapted module when the base
  is 16-bit and PEFT keeps the adapters fp32 — and ``lora_B`` saves the rank-r output (4r).
* Logits: the lm_head output (a·V), its fp32 upcast in the loss (4V, transient), and
  log-softmax's fp32 output (4V, saved), as transformers' loss makes them; torchtune's chunked loss upcasts
  one chunk at a time; Liger's and Apple's fused kernels never make the whole logits (modelled:
  :func:`head_activations`).

The textbook formula s·b·h·(34 + 5·nh·s/h) (Korthikanti et al. 2022, GPT-3 style MHA, GELU MLP
of 4h, dropout everywhere) misses SwiGLU's three f-sized tensors, RMSNorm's fp32 upcasts and
the fp32 logits, and counts dropout masks Llama does not have: see :func:`korthikanti`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from cabe import compressed_attention, linear_attention, ssm
from cabe.architecture import LayerGroup, Linear, ModelSpec
from cabe.method import head_targets, lora_parameter_targets, lora_targets, saved_modules, wrapped_adapter_sizes
from cabe.precision import Dtypes
from cabe.training import TrainingSetup
from cabe.units import round_alloc


@dataclass(frozen=True)
class Term:
    """One saved tensor group: ``bytes_per_token`` for one layer (or for the model head)."""

    name: str
    bytes_per_token: int
    formula: str


@dataclass(frozen=True)
class LayerActivations:
    terms: tuple[Term, ...]
    backward_workspace_per_token: int  # transient extra while one layer runs backward
    forward_workspace_per_token: int  # transient extra while one layer runs forward
    per_layer_bytes: int = 0  # saved tensors that do not grow with tokens (Gemma's fp32 1 + w)
    flash_rng_bytes: int = 0  # CUDA flash attention's philox seed and offset (not on the CPU kernel)
    # what the MLP block saves, released before attention's backward (_freed_before_attention_backward),
    # and the transient of attention's own backward (the math / eager kernels' s×s gradients)
    mlp_saved_per_token: int = 0
    attention_workspace_per_token: int = 0
    # DoRA: the largest transient of one adapted module's weight norm, made in every forward (per layer)
    dora_norm_bytes: int = 0
    # the block's backward transient while every saved tensor is still alive (the layer's MLP backward); the
    # attention's own transient comes later, once the MLP's saved tensors are released (step.LayerRun)
    mlp_workspace_per_token: int = 0
    # of ``terms``: the bytes per token that are the layer's input itself (a norm that saves its fp32 input
    # as it is): under checkpointing that tensor is the checkpoint's saved input, not a new one
    input_alias_per_token: int = 0
    # the MLP backward's transient that does not grow with tokens (a LoRA-wrapped expert stack's W' gradient)
    mlp_workspace_constant: int = 0
    # the largest transient of one adapted module's forward: PEFT's cast of its input to the adapters' dtype and
    # the dropped copy (see _Layer.note_lora_input); under checkpointing it comes back in the layer's recompute
    lora_forward_transient_per_token: int = 0
    # DoRA with dropout on a Conv1D (fan_in_fan_out) layer: the gradient of PEFT's throwaway ``Parameter(W.T)``
    # (see _Layer._dora_stray_parameter), made in this layer's backward and freed with the graph; of it, the
    # MLP block's
    stray_grad_bytes: int = 0
    stray_grad_mlp_bytes: int = 0
    # DeepSeek-V3.2's lightning indexer (no_grad): its largest transient while it scores (see
    # _Layer._indexer_transient), and the bytes per token the layer saves after it ran (not yet alive then)
    indexer_transient_per_token: int = 0
    indexer_after_per_token: int = 0
    # the largest moment of one adapted module's forward (PEFT's input copies, LoRA's or DoRA's output arithmetic),
    # in bytes for the setup's tokens, beyond all the layer saves (see _Layer.note_lora_input, _note_dora_result):
    # a transient of the forward and of a recompute
    dora_result_bytes: int = 0
    # the routed experts' backward before any MLP gradient exists (grouped_mm dispatch: _dispatch_workspace), per
    # token, beside every tensor the layer saved; 0: none
    dispatch_workspace_per_token: int = 0
    # of ``terms``: what the routed experts' backward has released by the time it makes their weights' last
    # gradient (the experts' outputs, products and activations, and all the block saved after them), per token;
    # the MLP block's gradient moment holds every gradient beside the rest (step.LayerRun.experts_freed)
    experts_freed_per_token: int = 0
    # checkpointing: the gradient of the layer's output, waiting in autograd's input buffer while the layer is
    # recomputed (set where it is not small beside the rest: DeepSeek-V4's n streams, cabe.compressed_attention)
    output_grad_per_token: int = 0

    @property
    def indexer_moment_per_token(self) -> int:
        """What the indexer adds on top of every saved tensor of the layer it runs in: its transient less what the
        layer saves only after it (a moment inside the layer's forward, or inside a checkpointed recompute)."""
        return max(0, self.indexer_transient_per_token - self.indexer_after_per_token)

    @property
    def constant_bytes(self) -> int:
        return self.per_layer_bytes + self.flash_rng_bytes

    @property
    def bytes_per_token(self) -> int:
        return sum(t.bytes_per_token for t in self.terms)


def attention_kind(spec: ModelSpec, setup: TrainingSetup) -> str:
    """What attention really runs: ``eager`` or ``flash`` (fused SDPA kernels).

    ``sdpa`` runs what the family's ``sdpa_fallback`` says when SDPA cannot use a fused kernel
    (Gemma 2's soft-capping: eager; Falcon's multi-query call: PyTorch's math kernel, which upcasts
    q, k, v to fp32 and keeps the s×s softmax).
    """
    if setup.attention == "eager":
        return "eager"
    if setup.attention == "sdpa" and spec.sdpa_fallback:
        return spec.sdpa_fallback
    return "flash"


def sdpa_masked_layers(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Layers whose SDPA call gets an explicit mask from transformers, so that flash cannot run.

    transformers/masking_utils.py (5.24), ``sdpa_mask`` -> ``_ignore_causal_mask_sdpa``: the mask is skipped
    (``is_causal=True`` instead) unless ``local_attention_size is not None and kv_length >=
    local_attention_size``; sliding layers pass their window as ``local_size``, chunked layers their chunk."""
    if setup.attention != "sdpa" or spec.sdpa_fallback:
        return 0
    s = setup.tokens_per_sequence
    if spec.sdpa_mask_window is not None and s >= spec.sdpa_mask_window:
        return spec.num_layers
    # chunked layers (Llama 4) pass their chunk as local_size (masking_utils.py, create_chunked_causal_mask)
    local = ("sliding", "chunked")
    return sum(g.count for g in spec.layer_groups if g.attention in local and g.window and s >= g.window)


def masked_sdpa_kind(spec: ModelSpec, dt: Dtypes) -> str:
    """The kernel SDPA runs with a mask on CUDA: ``efficient`` when the head dimension meets the
    memory-efficient kernel's alignment, else ``math`` (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
    ``select_sdp_backend``: flash is refused by ``check_for_attn_mask``; ``can_use_mem_efficient_attention``
    needs head dims divisible by ``minimum_gemm_alignment``, 8 for 16-bit and 4 for fp32 on sm80+)."""
    return "efficient" if spec.head_dim % (8 if dt.compute == 2 else 4) == 0 else "math"


def sdpa_gqa_math(spec: ModelSpec, setup: TrainingSetup, a_attn: int) -> bool:
    """An unmasked SDPA call with grouped kv heads and fp32 queries runs PyTorch's math kernel on CUDA.

    transformers passes ``enable_gqa=True`` when there is no mask and the head dim is at most 256
    (integrations/sdpa_attention.py 5.24, ``use_gqa_in_sdpa``); flash refuses fp32, and the memory-efficient
    kernel's dense constraints instantiate ``check_batch_size_and_num_heads_dense<false
    /*supports_grouped_query_attention=*/>`` (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp), so
    ``select_sdp_backend`` falls to math, which ``repeat_interleave``s k and v to the query's heads.
    Measured on an H200: TinyLlama fp32, batch 4, seq 1024 peaks at 42.3 GB (benchmarks/gpu/results)."""
    return (
        setup.attention == "sdpa"
        and not spec.sdpa_fallback
        and a_attn == 4
        and spec.num_kv_heads != spec.num_heads
        and spec.head_dim <= 256
    )


def layer_activations(
    spec: ModelSpec,
    setup: TrainingSetup,
    dt: Dtypes,
    *,
    base_trainable: bool,
    adapters: bool,
    group: LayerGroup | None = None,
    masked: bool = False,
    bottom: bool = False,
) -> LayerActivations:
    """Saved bytes per token of ONE decoder layer of ``group`` (the first run's when None) through which
    gradients flow. A model whose layers differ asks once per run (:attr:`ModelSpec.runs`). ``masked``: a
    layer whose SDPA call gets a mask (see :func:`sdpa_masked_layers`). ``bottom``: the lowest layer of the
    gradient's path when its input requires no grad (see ``_Layer.live``)."""
    layer = _Layer(spec, group or spec.runs[0], setup, dt, base_trainable, adapters, bottom)
    if (
        layer.group.mixer == "gated_deltanet"
    ):  # a linear-attention layer runs no attention kernel (cabe.linear_attention)
        layer.attn = layer.group.mixer
    if masked and layer.attn == "flash":
        layer.attn = masked_sdpa_kind(spec, dt)
    elif sdpa_gqa_math(spec, setup, layer.a_attn) and layer.attn == "flash":
        layer.attn, layer.gqa_repeat = "math", True
    bwd = layer.rms_norm_block() if spec.norm == "rmsnorm" else layer.layer_norm_block()
    attn, a, nh, s, quantized = layer.attn, layer.a, layer.nh, layer.s, layer.quantized
    fwd = max(_attention_forward_workspace(attn, a, nh, s), layer.mixer_forward)
    attn_bwd = max(_eager_backward_workspace(layer, attn, a, nh, s), _math_backward_workspace(attn, nh, s))
    attn_bwd = max(attn_bwd, layer.mixer_backward)
    if layer.group.mixer == "mamba2":  # the fused Mamba-2 kernel's own transients (cabe.ssm)
        x = ssm.in_proj_dtype(layer)
        fwd, attn_bwd = ssm.forward_workspace(spec, s, x, a), ssm.backward_workspace(spec, s, x, a)
    mlp_saved = _freed_before_attention_backward(layer)
    mlp_bwd = bwd  # the block's own backward transient, while every saved tensor is alive
    bwd = max(bwd, attn_bwd - mlp_saved)
    # flash and memory-efficient attention keep their philox seed and offset: two 512 B blocks
    rng = 2 * 512 if attn in ("flash", "efficient") and layer.group.mixer == "attention" else 0
    if spec.rotary_by_cat:  # NOTE: GPT-NeoX and Phi-3 cast cos and sin in every layer: (1, s, rotary_dim) each
        layer.constant += 2 * round_alloc(s * spec.rotary_dim * (4 if quantized else a))
    return LayerActivations(
        tuple(layer.terms),
        bwd,
        fwd,
        layer.constant,
        rng,
        mlp_saved,
        attn_bwd,
        layer.dora_norm_bytes,
        mlp_bwd,
        layer.input_alias,
        layer.backward_constant,
        max(layer.lora_pending.values(), default=0),  # modules whose saved tensors were never counted: at the end
        layer.stray_grads,
        layer.stray_grads_mlp,
        layer.indexer_transient,
        sum(t.bytes_per_token for t in layer.terms[layer.indexer_from :] if t.name not in _BEFORE_INDEXER)
        if layer.indexer_transient
        else 0,
        max(0, layer.dora_result_moment - layer.tokens * sum(t.bytes_per_token for t in layer.terms)),
        dispatch_workspace_per_token=layer.dispatch_workspace,
        experts_freed_per_token=layer.experts_freed,
        output_grad_per_token=layer.output_grad,
    )


#: saved terms of a DeepSeek-V3.2 layer counted after the indexer's point but made before it ran: expand_kv's value
#: (kv_b_proj's output, or flash's padded copy of it) exists when ``DeepseekV32Attention.forward`` calls the indexer
_BEFORE_INDEXER = frozenset(("attn.kv_b_output", "attn.value", "attn.value_padded"))


class _Layer:
    """The saved tensors of one decoder layer, term by term: the setup's dtypes and flags, and one
    method per kind of block (RMSNorm blocks of the Llama lineage, LayerNorm blocks of GPT-2's)."""

    def __init__(
        self,
        spec: ModelSpec,
        group: LayerGroup,
        setup: TrainingSetup,
        dt: Dtypes,
        base_trainable: bool,
        adapters: bool,
        bottom: bool = False,
    ) -> None:
        # the layer groups: what this layer is made of (its linears, MLP kind and width) is its group's
        self.spec, self.group, self.base_trainable, self.setup = spec, group, base_trainable, setup
        self.h, self.q, self.kv = spec.hidden_size, spec.q_dim, spec.kv_dim
        self.f, self.nh = spec.ffn_size(group), spec.num_heads
        self.s, self.batch = setup.tokens_per_sequence, setup.batch
        self.a, self.rho, self.autocast = dt.compute, dt.residual, dt.autocast
        self.dt_weight, self.dt_frozen = dt.weight, dt.frozen
        # a linear layer's input is cast per op: an fp32 residual under autocast, or LayerNorm's output
        # (layer_norm is on autocast's fp32 list) whatever the residual's dtype
        self.amp = dt.amp or (dt.autocast and spec.norm == "layernorm")
        self.targets = {lin.name for lin in lora_targets(spec, setup.lora_targets, group)} if adapters else set()
        # bare parameters PEFT wraps (MoE experts, routers: cabe.method.lora_parameter_targets), rank multiplier
        self.wrapped = (
            {lin.name: (lin, m) for lin, m in lora_parameter_targets(spec, setup.lora_targets, group)}
            if adapters
            else {}
        )
        self.backward_constant = 0  # a backward transient that does not grow with tokens (per layer)
        self.r = setup.lora_rank
        self.linear_by_name = {lin.name: lin for lin in group.linears}
        self.block = ""  # the block being counted ("attn" / "mlp"): GPT-2's two c_proj share a name
        # LoRA variants (peft/tuners/lora/layer.py 0.21, Linear.forward / variants.py DoraLinearVariant.forward)
        self.dora = adapters and setup.dora
        self.dora_norm_bytes = 0  # the largest of the adapted modules' weight-norm transients
        self.dora_result_moment = 0  # bytes: see _note_dora_result
        self.input_copies: dict[str, int] = {}  # per token: PEFT's copies of an adapted module's input
        self.lora_pending: dict[str, int] = {}  # per token: see note_lora_input
        self.tokens = setup.batch * setup.tokens_per_sequence
        self.stray_grads = self.stray_grads_mlp = 0  # DoRA + dropout on Conv1D (see _dora_stray_parameter)
        self.dropout = adapters and setup.lora_dropout > 0
        self.ad = dt.adapter
        # without autocast PEFT's _cast_input_dtype gives lora_A an fp32 copy of its input, which it saves
        self.adapter_cast = dt.adapter != dt.compute and not dt.autocast
        # QLoRA (bitsandbytes Linear4bit under autocast): the 4-bit layers save no input (their weight is
        # frozen), cast their output back to the fp32 residual dtype, and LoRA adapters run under autocast.
        # ``four_bit``: bitsandbytes' 4-bit layers, whatever the rest of the model is in; ``quantized`` (the terms
        # below): as prepare_model_for_kbit_training leaves the model, an fp32 residual that the 4-bit layers take
        # and return. Without it (``kbit_prep`` off: unsloth, LLaMA-Factory) the rest stays in the compute dtype and
        # a 4-bit layer reads and writes it as a frozen 16-bit nn.Linear does: LoRA's terms on a 16-bit base.
        self.four_bit = setup.method == "qlora" and any(lin.quantized_by_bnb for lin in spec.layer_linears)
        # (16-bit weights under the other half's autocast give an fp32 residual too: the prepared model's terms)
        # Without it a 4-bit layer still returns its input's dtype (bitsandbytes nn/modules.py Linear4bit.forward,
        # ``out.to(inp_dtype)``): under autocast LayerNorm's output is fp32 (layer_norm is on autocast's fp32 list),
        # so the MLP returns fp32 and the residual it is added to is fp32 from the first layer's output on: the
        # prepared model's terms again (gpt2-medium, pythia-1.4b; RMSNorm returns its input's 16 bits)
        ln_fp32 = dt.autocast and spec.norm == "layernorm" and self.four_bit and not setup.kbit_prep
        if ln_fp32:
            self.rho = 4
        self.quantized = self.four_bit and (setup.kbit_prep or (dt.autocast and dt.residual == 4) or ln_fp32)
        self.attn = attention_kind(spec, setup)
        self.setup_attention = setup.attention
        # transformers' flash_attention_2 casts fp32 queries, keys and values to 16 bits first (to the
        # quantized model's dtype under QLoRA without autocast: integrations/flash_attention.py,
        # get_target_dtype): the kernel saves those casts and writes a 16-bit output
        self.a_attn = 2 if (setup.attention == "flash" and dt.compute == 4) else dt.compute
        self.gqa = spec.num_kv_heads != spec.num_heads
        self.gqa_repeat = False  # the math kernel's enable_gqa: repeat_interleave copies k and v
        # rotary multiplies k by cos and sin in the residual's dtype: k reaches attention in that dtype
        self.key_cast = spec.position == "rotary" and self.rho != self.a_attn
        self.qkv_names, self.o_name = group.slot_names("qkv"), group.slot_names("o")[0]
        self.up_names, self.down_name = group.slot_names("up"), (group.slot_names("down") or [""])[0]
        self.terms: list[Term] = []
        self.constant = 0  # saved bytes per layer that do not grow with tokens
        self.mlp_from = 0  # the first term of the MLP block
        self.product_saved = False
        self.dense_experts_backward = 0  # the routed experts' own backward transient (expert_dispatch "dense")
        self.copy_before_shared = 0
        # a saved term that is the layer's input storage itself (see LayerActivations.input_alias_per_token)
        self.input_alias = 0  # the gated MLP's product is saved as it is (not a cast of it) by down_proj
        # a linear-attention mixer's kernel transients per token, forward and backward (cabe.linear_attention)
        self.mixer_forward = self.mixer_backward = 0
        self.indexer_transient = 0  # per token: DeepSeek-V3.2's indexer (see _indexer_transient)
        self.indexer_from = 0  # the first term saved after the indexer ran
        self.dispatch_workspace = 0  # per token: the grouped_mm experts' backward (see _dispatch_workspace)
        self.experts_freed = 0  # per token: see LayerActivations.experts_freed_per_token
        self.output_grad = 0  # per token: see LayerActivations.output_grad_per_token
        # Whether the tensor flowing through the block being counted requires grad. Autograd saves a tensor for an
        # op only when one of the op's inputs requires grad (torch/csrc/autograd: a node is recorded only then), so
        # in the lowest layer of LoRA's gradient path without checkpointing — its input, the frozen embedding's
        # output, requires none — nothing is saved until an adapted module's output joins the stream: its norms,
        # attention kernel and MLP save nothing below that point, and only what the adapters save for their own
        # weights' gradients is kept (``owned``). Blocks that do not follow ``live`` set it first (their old count).
        self.live = not bottom
        self.bottom = bottom
        self.owned = 0  # > 0 while counting what an adapted module saves for its own weights (kept in any case)
        self.input_live = self.live  # LayerNorm blocks: whether the layer's input (what a parallel MLP reads) is live
        self.ln2_pending = False  # GPT-2's second norm, on the residual after attention: counted if that is live

    def add(self, name: str, nbytes: int, formula: str) -> None:
        if nbytes and (self.live or self.owned):
            self.terms.append(Term(name, nbytes, formula))

    def add_owned(self, name: str, nbytes: int, formula: str) -> None:
        """A term kept whether or not the block is ``live`` (its caller decides: :func:`_moe`)."""
        with self.adapter_owned():
            self.add(name, nbytes, formula)

    @contextlib.contextmanager
    def adapter_owned(self) -> Iterator[None]:
        """What is added inside is saved by an adapted module for its own weights' gradients: kept in the lowest
        layer of the gradient's path too (see ``live``)."""
        self.owned += 1
        try:
            yield
        finally:
            self.owned -= 1

    def joins(self, names: list[str]) -> None:
        """An adapted module among ``names`` adds its LoRA output to the stream: what follows requires grad."""
        if any(n in self.targets for n in names):
            self.live = True

    def linear_inputs(self, group: str, names: list[tuple[str, int]], shared_bytes: int, shared_formula: str) -> None:
        """Inputs saved by the linear layers ``names`` (name, in_features) that read one tensor."""
        with self.adapter_owned():
            self._linear_inputs(group, names, shared_bytes, shared_formula)

    def _linear_inputs(self, group: str, names: list[tuple[str, int]], shared_bytes: int, shared_formula: str) -> None:
        spec, targets, adapter_cast = self.spec, self.targets, self.adapter_cast
        for n, inf in names:
            self.note_lora_input(n, inf, shared_bytes // inf if inf else 0)
        trained = [n for n, _ in names if self.base_trainable]
        if self.amp or (self.quantized and self.autocast):
            for n, inf in names:
                if self.base_trainable or n in targets:
                    self.add(f"{group}.{n}.input_cast", 2 * inf, f"2·{_sym(inf, spec)}")
            return
        # lora_A saves the input itself (no cast, no dropout: nn.Dropout gives each adapter its own copy)
        reads_input = not adapter_cast and not self.autocast and not self.dropout
        direct = [n for n, inf in names if self._bnb_direct(n, shared_bytes // inf if inf else 0)]
        shared_needed = bool(trained) or (any(n in targets for n, _ in names) and reads_input)
        if shared_needed or (direct and not self.dropout):
            self.add(f"{group}.input", shared_bytes, shared_formula)
        for n, inf in names:
            if n not in targets:
                continue
            if n in direct:
                if self.dropout:  # lora_A saves the dropped copy nn.Dropout made, in x's 16-bit dtype
                    self.add(f"{group}.{n}.lora_dropout_output", 2 * inf, f"2·{_sym(inf, spec)}")
            elif adapter_cast:
                self.add(f"{group}.{n}.lora_input_fp32", 4 * inf, f"4·{_sym(inf, spec)}")
            elif self.autocast:
                # a 16-bit residual under autocast: PEFT casts it to the fp32 adapter's dtype, autocast
                # casts that back for lora_A, which saves the cast
                self.add(f"{group}.{n}.input_cast", 2 * inf, f"2·{_sym(inf, spec)}")
            elif self.dropout:  # the dropped copy of the input, lora_A's own (nn.Dropout's output)
                nb = shared_bytes // self.h if shared_bytes else self.a
                self.add(f"{group}.{n}.lora_dropout_output", nb * inf, f"{nb}·{_sym(inf, spec)}")

    def _bnb_direct(self, n: str, x_bytes: int) -> bool:
        """Whether adapted module ``n`` is a 4-bit layer whose lora_A reads its 16-bit input as it is: under
        autocast PEFT's bitsandbytes ``Linear4bit.forward`` skips the fp32 input cast (peft 0.21.2
        tuners/lora/bnb.py:542-545, ``requires_conversion = not torch.is_autocast_enabled()``), and without
        k-bit preparation that input is already autocast's 16 bits: lora_A's matmul saves x itself (shared by
        the adapters that read it), where a 16-bit nn.Linear's adapter saves a cast of PEFT's fp32 copy."""
        if not (self.four_bit and not self.quantized and self.autocast and x_bytes == 2) or n not in self.targets:
            return False
        lin = self._linear(n)
        return lin is not None and lin.quantized_by_bnb

    def note_lora_input(self, n: str, inf: int, x_bytes: int) -> None:
        """The forward transient of adapted module ``n`` reading ``inf`` values of ``x_bytes`` each per token,
        counted when the module's saved tensors are (:meth:`lora_variants`, :meth:`_note_adapter_moment`).

        PEFT 0.21 ``lora.Linear.forward`` (tuners/lora/layer.py): ``result = self.base_layer(x)``, then
        ``x = self._cast_input_dtype(x, lora_A.weight.dtype)`` makes a copy in the adapters' dtype when x's
        differs, ``dropout(x)`` a dropped copy, and ``result = result + lora_B(lora_A(dropout(x))) * scaling``,
        cast back to the result's dtype. Under autocast lora_A saves its own 16-bit cast, so neither copy is saved:
        both live until lora_A has cast. Without autocast lora_A saves what it reads (counted in linear_inputs),
        and only the copy that dropout read is transient. Beside them: x itself (the call's argument, saved by
        nothing when lora_A reads a copy or a cast), the base layer's output, lora_B's output and its scaled copy
        (lora_B's dtype: 16 bits under autocast, the adapters' without), then the sum (the promoted dtype) beside
        the scaled copy. mistral-7b LoRA with dropout, bf16 weights under autocast, checkpointing: the recomputed
        down_proj's two fp32 copies, 8·f per token, set the peak (−5.8% without them); phi-3-mini LoRA with
        dropout, bf16 weights without autocast, s2048: gate_up_proj's fp32 lora_B output and its scaled copy,
        2·4·2f per token (−4.0% without them)."""
        if n not in self.targets:
            return
        direct = self._bnb_direct(n, x_bytes)  # lora_A reads (and saves) x itself: no copy
        copy = self.ad * inf if x_bytes != self.ad and not direct else 0
        dropped = self.ad * inf if self.dropout else 0
        self.input_copies[n] = copy + dropped  # locals of lora.Linear.forward
        lin = self._linear(n)
        if lin is None or self.dora:  # DoRA's output arithmetic: _note_dora_result
            return
        o = lin.out_features
        quantized_out = self.quantized and lin.quantized_by_bnb  # Linear4bit returns the input's dtype
        res = 2 if self.autocast else (x_bytes if quantized_out else self.a)
        bo = 2 if self.autocast else self.ad
        total = max(res, bo)
        out = max(res + 2 * bo, res + bo + total) * o
        reads_copy = self.dropout or (not direct and (self.autocast or x_bytes != self.ad))
        x_alive = x_bytes * inf if reads_copy and not self.base_trainable else 0
        copies = copy + dropped if self.autocast else (copy if self.dropout else 0)
        self.lora_pending[n] = copies + x_alive + out

    def _note_adapter_moment(self, n: str) -> None:
        """Module ``n``'s forward transient (:meth:`note_lora_input`) beside what the layer saved up to it,
        in bytes for the setup's tokens; the layer keeps the largest, less its whole saved set at the end."""
        t = self.lora_pending.pop(n, 0)
        if t:
            saved = sum(term.bytes_per_token for term in self.terms)
            self.dora_result_moment = max(self.dora_result_moment, self.tokens * (saved + t))

    def _linear(self, n: str) -> Linear | None:
        """The layer's linear named ``n``, the one of the block being counted when two share the name (GPT-2 and
        GPTBigCode call both output projections ``c_proj``: 768 -> 768 in attention, 3072 -> 768 in the MLP)."""
        same = [lin for lin in self.group.linears if lin.name == n]
        return next((lin for lin in same if lin.role == self.block), same[-1] if same else None)

    def lora_mid(self, names: list[str]) -> None:
        r = self.r
        with self.adapter_owned():
            for n in names:
                if n in self.targets:
                    per = 2 * r if self.autocast else 4 * r
                    self.add(f"lora.{n}.A_output", per, f"{per // r}·r")
            self.lora_variants(names)
        self.joins(names)

    def lora_variants(self, names: list[str]) -> None:
        """What LoRA dropout and DoRA save for each adapted module of ``names`` (PEFT 0.21).

        Dropout (``nn.Dropout`` before lora_A, tuners/lora/layer.py:1101): CUDA's fused dropout saves a
        1-byte mask of lora_A's input; its output replaces what lora_A saved (see :meth:`linear_inputs`).

        DoRA (tuners/lora/dora.py:132-165, ``DoraLinearLayer.forward``): the output is
        ``(m/‖W + sBA‖ - 1) · base_result + m/‖W + sBA‖ · lora_B(lora_A(x)) · s``, the norm detached
        (dora.py:152). The two products save ``base_result`` (the base layer's output; with dropout a new
        ``F.linear`` of the dropped input, dora.py:163) and lora_B's output, tokens × out each, and the
        out-sized ``m/‖·‖`` and ``m/‖·‖ - 1`` and the norm that the division saves (per layer).
        """
        for n in names:
            lin = self._linear(n)
            if lin is None or n not in self.targets:
                continue
            i, o = lin.in_features, lin.out_features
            if self.dropout:
                self.add(f"lora.{n}.dropout_mask", i, f"1·{_sym(i, self.spec)}")
            if not self.dora:
                self._note_adapter_moment(n)
                continue
            # base layer's output: autocast's 16 bits, else the layer's compute dtype; with dropout
            # F.linear(dropped x, W.to(x.dtype)) runs in lora_A's input dtype (the adapter's, without autocast)
            rb = 2 if self.autocast else (self.ad if self.dropout else self.a)
            if self.quantized and lin.quantized_by_bnb and not self.dropout:
                rb = 4  # Linear4bit's output, in its fp32 input's dtype (peft tuners/lora/bnb.py:533 clones it)
            if lin.bias and not self.dropout:
                # ``base_result = base_result - bias`` (dora.py:158): a new tensor in the promoted dtype of the
                # output and the bias (the frozen weights' dtype; prepare_model_for_kbit_training's fp32 for 4-bit
                # layers), which the product then saves (pythia-1.4b DoRA, fp32 weights under autocast: -9.2%)
                # 16-bit weights under the other half's autocast (fp16 weights, bf16 autocast: an fp32 residual): the
                # autocast output minus the bias of the other half type promotes to fp32 (starcoderbase-1b DoRA, fp16
                # weights under bf16 autocast, b1 × 4096: −12.4% with it 16-bit)
                halves = self.autocast and rb == 2 and self.dt_frozen == 2 and self.rho == 4
                rb = max(rb, 4 if (self.quantized and lin.quantized_by_bnb) or halves else self.dt_frozen)
            rl = 2 if self.autocast else self.ad  # lora_B's output
            self.add(f"dora.{n}.base_result", rb * o, f"{rb}·{_sym(o, self.spec)}")
            self.add(f"dora.{n}.lora_result", rl * o, f"{rl}·{_sym(o, self.spec)}")
            self.constant += 3 * self.ad * o  # m/‖·‖, m/‖·‖ - 1, ‖·‖ (adapter dtype)
            self.dora_norm_bytes = max(self.dora_norm_bytes, self._dora_norm_transient(lin))
            self._note_dora_result(lin, rb, rl)
            if self.dropout:
                self.constant += self._dora_dropout_weight(lin)
                self._dora_stray_parameter(n, lin)

    def _dora_stray_parameter(self, n: str, lin: Linear) -> None:
        """DoRA with dropout on a Conv1D layer (PEFT sets ``fan_in_fan_out`` for them): ``F.linear(x,
        transpose(W, fan_in_fan_out))`` (peft 0.21 tuners/lora/dora.py:163), and ``transpose`` wraps ``W.T`` in a
        new ``torch.nn.Parameter`` (peft/utils/other.py:1315-1316), which requires grad, whenever ``W.to(x.dtype)``
        returned the frozen weight itself (the adapters' dtype is the weights'). So the matmul saves its input
        too (under autocast a 16-bit cast of the dropped input of its own; without it the dropped input lora_A
        already saves), and backward makes that throwaway parameter's gradient (in×out in the weights' dtype),
        which lives until the graph is freed after backward. gpt2-medium DoRA + dropout on c_proj, fp32 weights
        under fp16 autocast: -3.9% without the casts."""
        if not dora_stray_parameter(self.spec, self.four_bit, self.ad, self.dt_frozen, lin):
            return
        i = lin.in_features
        if self.autocast:
            self.add(f"dora.{n}.linear_input_cast", 2 * i, f"2·{_sym(i, self.spec)}")
        g = round_alloc(self.dt_frozen * i * lin.out_features)
        self.stray_grads += g
        if self.block == "mlp":
            self.stray_grads_mlp += g

    def _note_dora_result(self, lin: Linear, rb: int, rl: int) -> None:
        """The end of one DoRA module's forward (peft 0.21 tuners/lora/dora.py:135-165 ``DoraLinearLayer.forward``;
        variants.py ``DoraLinearVariant.forward``), when ``(m/‖·‖ − 1) · base_result + m/‖·‖ · lora_result ·
        scaling`` is computed: the first product (in the promoted dtype of the adapters' magnitude and the base
        result), the second and its scaled copy (magnitude and lora_B's output) are alive at once, then the sum
        beside two of them (none of them saved: the products save their inputs). Beside them: with dropout the
        base layer's own output (``result``, which the module adds to afterwards; without dropout it is the saved
        ``base_result``), and the function's locals, alive until it returns: the base weight cast to the input's
        dtype (``weight.to(x.dtype)``) and lora_B·lora_A cast likewise (``lora_weight.to(x.dtype)``), each i×o
        when a cast copies, and lora.Linear.forward's copies of the input (its cast to the adapters' dtype, the dropped
        copy: see :meth:`note_lora_input`). Everything the layer saved up to this module is alive, what it saves later is not:
        the moment is kept in bytes, less the layer's whole saved set at the end. phi-3-mini DoRA + dropout,
        bf16 weights under bf16 autocast, checkpointing, s4096: the recomputed gate_up_proj's three fp32
        (tokens × 2f) products and two fp32 i×o casts set the peak (−4.2% without them)."""
        i, o = lin.in_features, lin.out_features
        r1, r2 = max(self.ad, rb), max(self.ad, rl)
        per_token = max(r1 + 2 * r2, r1 + r2 + max(r1, r2)) * o
        if self.dropout:
            per_token += (2 if self.autocast else self.a) * o  # the base layer's output, ``result``
        per_token += self.input_copies.get(lin.name, 0)  # x cast to the adapters' dtype, and dropped
        x = 4 if self.quantized and lin.quantized_by_bnb else self.ad
        w = self.dt_frozen if not (self.quantized and lin.quantized_by_bnb) else 2
        e = 2 if self.autocast else self.ad
        const = round_alloc(i * o * x) * ((w != x) + (e != x))
        saved = sum(t.bytes_per_token for t in self.terms)
        self.dora_result_moment = max(self.dora_result_moment, self.tokens * (saved + per_token) + const)

    def _dora_norm_transient(self, lin: Linear) -> int:
        """What one DoRA module's weight norm holds at once, in every forward (peft 0.21 dora.py:86-101,
        132-145): ``eye(in)`` pushed through lora_A and lora_B (its graph saves the eye, in 16 bits under
        autocast, until forward returns), that in × out product cast to lora_A's input dtype x, the base
        weight cast to x's dtype, and ``W + s·BA`` being summed while ``s·BA`` lives: at the sum,
        i²·e + i·r·e + 3·i·o·x (+ i·o·x for the weight's cast). Before it, lora_B's call holds the fp32 eye,
        its cast and the product: i²·(x + e) + i·o·e under autocast."""
        i, o, r = lin.in_features, lin.out_features, self.r
        e = 2 if self.autocast else self.ad  # lora_A / lora_B's compute dtype
        # bnb layers skip PEFT's input cast under autocast: x is the residual's dtype (fp32 after k-bit preparation)
        x = (self.rho if self.autocast else self.ad) if self.four_bit and lin.quantized_by_bnb else self.ad
        w = self.dt_frozen if not (self.four_bit and lin.quantized_by_bnb) else 2
        at_sum = i * i * e + i * r * e + 3 * i * o * x + (i * o * x if w != x else 0)
        at_lora_b = i * i * (self.ad + (e if e != self.ad else 0)) + i * r * e + i * o * e
        return max(at_sum, at_lora_b)

    def _dora_dropout_weight(self, lin: Linear) -> int:
        """With dropout, DoRA's ``F.linear(x, W.to(x.dtype))`` (dora.py:163) saves the weight it multiplies
        by when that is a new tensor: a copy in the adapter's dtype (no autocast), or autocast's 16-bit
        cast of it (not a leaf: cast anew, never cached) unless the weight was 16-bit all along."""
        n = lin.in_features * lin.out_features
        if self.autocast:
            return round_alloc(2 * n) if (self.ad, self.dt_frozen) != (2, 2) else 0
        return round_alloc(self.ad * n) if self.ad != self.dt_frozen else 0

    def rms_norm(
        self,
        name: str,
        width: int,
        width_sym: str,
        trainable: bool,
        fp32_weight: bool,
        rows: int = 1,
        rows_sym: str = "",
        in_bytes: int | None = None,
    ) -> None:
        """``in_bytes``: dtype of the norm's input (the residual stream ρ, or a for q/k norms);
        ``fp32_weight``: the weight multiplies the fp32 normalised tensor (Gemma, OLMo 2)."""
        self.add(f"{name}.fp32_input", 4 * width, f"4·{width_sym}")
        self.add(f"{name}.rsqrt", 4 * rows, f"4·{rows_sym}" if rows_sym else "4")
        width_in = self.rho if in_bytes is None else in_bytes
        if trainable:
            nb = 4 * width if fp32_weight else width_in * width
            self.add(f"{name}.normalized", nb, f"{nb // width}·{width_sym}")
        if fp32_weight and self.spec.norm_plus_one:
            self.constant += 4 * (self.spec.head_dim if rows_sym else width)  # (1 + w) in fp32, saved by the multiply

    def rms_norm_block(self) -> int:
        """RMSNorm blocks (Llama, Gemma, Phi-3, Mixtral, OLMo 2): attention, then a gated or MoE MLP.
        Returns the backward workspace per token."""
        if self.spec.compressed_attention:  # DeepSeek-V4's layer (cabe.compressed_attention): follows ``live``
            return compressed_attention.add_block(self)
        if self.group.mixer == "mamba2":
            ssm.mixer_terms(self)
        elif self.group.mixer == "gated_deltanet":
            linear_attention.add_block(self)
        elif self.spec.latent_attention:
            self._latent_attention()
        else:
            self._rms_attention()
        self.mlp_from = len(self.terms)
        self._rms_mlp()
        if self.dense_experts_backward:
            return self._dense_experts_backward()
        if self.product_saved:
            # the product itself is what down_proj's backward node saved (its MmBackward0, or lora_A's when no
            # cast stands between them): autograd releases it once that node has run, before MulBackward0 makes
            # the gradients of the activation and of up's output beside the product's own — 3 f-sized tensors
            # with the product gone, and the layer's incoming gradient (ρ·h). Traced: llama-2-7b QLoRA without
            # autocast (a = 4) keeps gate, act and up plus 8·f and 4·h at the layer's peak, not 12·f + 8·h.
            return 2 * self.a * self.f + self.rho * self.h
        # otherwise lora_A saved a cast of the product (autocast's, or PEFT's fp32 one): the LoRA path's
        # gradient goes through that cast's ToCopyBackward0 while the base's gradient waits for the sum.
        # Under QLoRA's prepared model the MLP's outputs are fp32 (Linear4bit returns its fp32 input's dtype): so
        # are the product's gradient (bitsandbytes' MatMul4Bit.backward casts it back to the input's dtype) and
        # MulBackward0's two (a plain 2-layer Qwen2.5-1.5B, vocab 4096, QLoRA b1 × 2048: −10.7% with them 16-bit)
        m = 4 if self.quantized else self.a
        return 3 * m * self.f + 2 * self.rho * self.h  # backward workspace per token

    def _rms_attention(self) -> None:
        spec, h, q, kv, nh = self.spec, self.h, self.q, self.kv, self.nh
        a, rho = self.a, self.rho
        base_trainable, qkv_names, o_name = self.base_trainable, self.qkv_names, self.o_name
        wf = spec.norm_weight_fp32
        post_norm_only = spec.norm_placement == "post"
        sandwich = spec.norm_placement == "sandwich"
        # ---- attention block -----------------------------------------------------------------
        if post_norm_only:
            attn_in_bytes, attn_in_formula = rho * h, f"{rho}·h"  # the residual itself feeds q, k, v
        else:
            self.rms_norm("input_norm", h, "h", base_trainable, wf)
            attn_in_bytes, attn_in_formula = rho * h, f"{rho}·h"
            if rho == 4:
                # RMSNorm's ``hidden_states.to(torch.float32)`` returns an fp32 input itself (models/llama/
                # modeling_llama.py:66, transformers 5.24), and the multiply saves it: the layer's input. A
                # recomputed layer (checkpointing) re-saves the checkpoint's input tensor, no new memory.
                self.input_alias = 4 * h
        self.linear_inputs("attn", [(n, h) for n in qkv_names], attn_in_bytes, attn_in_formula)
        self.lora_mid(qkv_names)
        if spec.qk_norm == "l2" and self.group.rope:
            # Llama 4's Llama4TextL2Norm (no weight) after rotary: the fp32 q and k and one rsqrt per head
            self.rms_norm("q_l2_norm", q, "q", False, False, nh, "nh", in_bytes=a)
            self.rms_norm("k_l2_norm", kv, "kv", False, False, spec.num_kv_heads, "nkv", in_bytes=a)
        if spec.nope_temperature_tuning and not self.group.rope:
            # Llama4TextAttention.forward: query * attn_scales, an fp32 (s,) vector made in each NoPE layer and
            # saved by the multiply (an expanded view of it); the product is cast back to the query's dtype
            self.constant += 4 * self.s
        if spec.qk_norm == "head":
            # per-head norms: one rsqrt per head
            self.rms_norm("q_norm", q, "q", base_trainable, wf, nh, "nh", in_bytes=a)
            self.rms_norm("k_norm", kv, "kv", base_trainable, wf, spec.num_kv_heads, "nkv", in_bytes=a)
        elif spec.qk_norm == "full":
            self.rms_norm("q_norm", q, "q", base_trainable, True)
            self.rms_norm("k_norm", kv, "kv", base_trainable, True)
        self._core()
        self._o_proj_input()
        self.lora_mid([o_name])
        if sandwich:
            self.rms_norm("post_attention_norm", h, "h", base_trainable, True)
        if post_norm_only:
            self.rms_norm("post_attention_norm", h, "h", base_trainable, True)

    def _latent_attention(self) -> None:
        """Multi-head latent attention (transformers 5.24, models/deepseek_v3/modeling_deepseek_v3.py,
        ``DeepseekV3Attention.forward`` and ``expand_kv``), checked against the fake-CUDA trace:

        * ``q_a_proj`` and ``kv_a_proj_with_mqa`` read the normed input (one tensor); ``q_a_layernorm`` and
          ``kv_a_layernorm`` are RMSNorms over the ranks (their fp32 upcast, rsqrt, normalised tensor), and
          their outputs are what ``q_b_proj`` and ``kv_b_proj`` save.
        * rotary multiplies slices of q and of the shared rotary key by cos and sin, which saves only cos and
          sin (the model's, made once); ``torch.cat((q_pass, q_rot))`` makes the query anew.
        * ``expand_kv``: the key is a new tensor (``new_empty`` + two ``copy_``), heads × (nope + rope); the
          value is a split view of ``kv_b_proj``'s output, so the kernel that saves it keeps that whole
          output alive: heads × (nope + v_head_dim).
        * SDPA: query / key heads (nope + rope) differ from value heads (v_head_dim), which flash refuses
          (``can_use_flash_attention`` checks equal head dims, aten/src/ATen/native/transformers/cuda/
          sdp_utils.cpp); with no mask (causal) CUDA runs the memory-efficient kernel, which saves q, k, v,
          its output (heads × v_head_dim, already laid out as o_proj reads it) and the fp32 logsumexp.
          Eager saves the fp32 softmax and its cast, a copy of the value (``bmm`` reshapes the strided view)
          and o_proj a contiguous copy of the output (tests/core_torch/test_saved_tensors.py).
        """
        spec, h, nh, s, a, rho = self.spec, self.h, self.nh, self.s, self.a, self.rho
        la = spec.latent_attention
        assert la is not None
        bt, names = self.base_trainable, self.qkv_names
        # In the bottom layer of LoRA's path (``live`` false on entry) the query's path requires grad from an adapted
        # q_a_proj / q_proj / q_b_proj on, the key and value's from an adapted kv_a_proj_with_mqa / kv_b_proj on;
        # each op saves only for the inputs that require grad (eager's q @ kᵀ the key for the query's gradient and
        # the query for the key's, probs @ v the probabilities for v's); the fused kernels save all they read
        entry, targets = self.live, self.targets
        q_live = entry or any(n in targets for n in ("q_a_proj", "q_proj", "q_b_proj"))
        kv_live = entry or any(n in targets for n in ("kv_a_proj_with_mqa", "kv_b_proj"))
        self.rms_norm("input_norm", h, "h", bt, spec.norm_weight_fp32)
        readers = [n for n in names if n in ("q_a_proj", "q_proj", "kv_a_proj_with_mqa")]
        self.linear_inputs("attn", [(n, h) for n in readers], rho * h, f"{rho}·h")
        self.lora_mid(readers)
        for norm, rank, sym, proj, first in (
            ("q_a_layernorm", la.q_lora_rank, "r_q", "q_b_proj", "q_a_proj"),
            ("kv_a_layernorm", la.kv_lora_rank, "r_kv", "kv_b_proj", "kv_a_proj_with_mqa"),
        ):
            if not rank:
                continue
            self.live = entry or first in targets
            self.rms_norm(f"attn.{norm}", rank, sym, bt, False, in_bytes=a)
            self.linear_inputs(f"attn.{proj}", [(proj, rank)], a * rank, f"{a}·{sym}")
            self.lora_mid([proj])
        self.live = q_live or kv_live
        eager = self.attn == "eager" and self.setup_attention != "flash"
        a_attn = self.a_attn
        qk, kvb, vo = nh * la.qk_head_dim, nh * (la.nope_dim + la.v_head_dim), nh * la.v_head_dim
        if kv_live or not eager:
            self.add("attn.query", a_attn * qk, f"{a_attn}·nh·(d_nope + d_rope)")
        if q_live or not eager:
            self.add("attn.key", a_attn * qk, f"{a_attn}·nh·(d_nope + d_rope)")
        if la.index_heads:
            self._indexer_transient()
        if la.index_heads and self.attn != "eager":
            # DeepseekV32Attention.forward folds the indexer's top-k into a boolean mask for SDPA; PyTorch's CUDA
            # branch turns it into an additive one of the query's dtype (convert_boolean_attn_mask), which the
            # memory-efficient kernel saves, padded to a multiple of 8 (see _efficient_attention_core)
            self.add("attn.mask_bias", a_attn * (-(-s // 8) * 8), f"{a_attn}·s")
        if self.setup_attention == "flash":
            # flash_attention_2 (integrations/flash_attention.py, 5.24) pads v to the q / k head dim and crops the
            # kernel's output, which reshape then copies for o_proj (counted by _o_proj_input)
            self.add("attn.value_padded", a_attn * qk, f"{a_attn}·nh·(d_nope + d_rope)")
            self.add("attn.output_padded", a_attn * qk, f"{a_attn}·nh·(d_nope + d_rope)")
            self.add("attn.logsumexp", 4 * nh, "4·nh")
        elif self.attn == "eager":
            # matmul(probs, v) reshapes the strided value view for bmm: a copy, saved in its place
            self.add("attn.value", a * vo, f"{a}·nh·d_v")
            self.add("attn.softmax_fp32", 4 * nh * s, "4·nh·s")
            if a != 4 and kv_live:
                self.add("attn.probs", a * nh * s, f"{a}·nh·s")
        elif self.quantized and self.autocast:
            # QLoRA under autocast: kv_b_proj's 4-bit layer returns fp32, and autocast casts q, k and v to 16 bits
            # for SDPA: the kernel saves the value's contiguous cast, not kv_b_proj's output
            self.add("attn.value_cast", a_attn * vo, f"{a_attn}·nh·d_v")
            self.add("attn.output", a_attn * vo, f"{a_attn}·nh·d_v")
            self.add("attn.logsumexp", 4 * nh, "4·nh")
        else:
            # the fused kernels take the strided value view: kv_b_proj's whole output stays alive
            self.add("attn.kv_b_output", a * kvb, f"{a}·nh·(d_nope + d_v)")
            self.add("attn.output", a_attn * vo, f"{a_attn}·nh·d_v")
            self.add("attn.logsumexp", 4 * nh, "4·nh")
        self.q = vo  # what o_proj reads, for its LoRA terms
        if self.setup_attention == "flash" and (bt or self.o_name in self.targets):
            self.add("attn.output_for_o_proj", a_attn * vo, f"{a_attn}·nh·d_v")  # the cropped output, copied
        self._o_proj_input()
        self.lora_mid([self.o_name])

    def _indexer_transient(self) -> None:
        """DeepSeek-V3.2's lightning indexer (transformers 5.24 models/deepseek_v32/modeling_deepseek_v32.py,
        ``DeepseekV32Indexer.forward``, under ``torch.no_grad``: nothing saved) scores every query against every key
        with ``torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1))``: q is (b, s, H_I, D_I), k
        (b, 1, D_I, s). ``at::matmul`` broadcasts the batch dimensions with ``expand(...).reshape(...)``
        (``_matmul_impl``, aten/src/ATen/native/LinearAlgebra.cpp), which copies k once per query: a (b·s, D_I, s)
        tensor, beside the (b·s, H_I, s) scores ``bmm`` writes. The matmul runs in fp32 (the ``.float()`` casts) or,
        under autocast, in 16 bits (matmul is on autocast's lower-precision list: it casts both again). Per token,
        at that moment: the rotated q and k (the compute dtype), their ``.float()`` copies (none when already fp32),
        autocast's 16-bit casts, the broadcast copy of k and the scores; then the scaled scores beside the scores.
        Traced on fake CUDA
        (tests/trace/test_deepseek_trace.py): a 2 × 512-token tiny V3.2 shows the 128 MiB clone at the forward peak.
        """
        la = self.spec.latent_attention
        assert la is not None
        a, s, hi, di = self.a, self.s, la.index_heads, la.index_head_dim
        mm = 2 if self.autocast else 4  # the dtype the scoring matmul runs in
        # the rotated q and k, torch.cat'd (locals until the end): rotary multiplies by cos and sin in the residual's
        # dtype, so an fp32 residual promotes them to fp32
        qd = max(a, self.rho)
        qk = qd * (hi * di + di)
        casts = (4 * (hi * di + di) if qd != 4 else 0) + (mm * (hi * di + di) if mm != 4 else 0)
        # with one sequence the expanded k reshapes to a view (a size-1 dimension merges with the stride-0 one):
        # bmm reads it as it is, nothing is copied (as in _math_attention_core)
        broadcast = mm * di * s if self.batch > 1 else 0
        # the matmul's moment (its operands' casts, the broadcast k, the scores), or the next one: the scores
        # times softmax_scale beside the scores (then relu's output beside those: the same two)
        self.indexer_transient = qk + max(casts + broadcast + mm * hi * s, 2 * mm * hi * s)
        # the attention's query is still the torch.cat of the rotated halves there (promoted to the residual's
        # dtype): autocast casts it to 16 bits for SDPA only after the indexer, and SDPA saves that cast (which is
        # then counted after the indexer)
        qm = self.nh * la.qk_head_dim
        self.indexer_from = len(self.terms)
        if qd > self.a_attn:
            self.indexer_transient += qd * qm
            self.indexer_from -= 2  # attn.query, attn.key: made before the indexer, but the query's cast after it
            self.indexer_transient += self.terms[-1].bytes_per_token  # the key (no cast) exists already
            if self.quantized:  # ... built in kv_b_proj's fp32 output dtype (``kv_nope.new_empty``): 4 bytes, not a
                self.indexer_transient += (4 - self.a_attn) * qm
        # DeepseekV32Attention.forward's locals while the indexer runs (modeling_deepseek_v32.py:416-441, 5.24):
        # q_b_proj's output (q_pass and q_rot are views of it), in its output dtype — fp32 from a 4-bit layer, which
        # returns its (fp32) input's dtype, with the LoRA sum —; under QLoRA also kv_b_proj's fp32 output (k_nope and
        # value_states are views of it: the kernel later saves the value's 16-bit cast, made after the indexer)
        qb = 4 if self.quantized else a
        self.indexer_transient += qb * qm
        if self.quantized:
            self.indexer_transient += 4 * self.nh * (la.nope_dim + la.v_head_dim)

    def _core(self) -> None:
        """The attention kernel's saved tensors (:func:`_attention_core`) with this layer's shapes and flags."""
        _attention_core(
            self.add,
            self.attn,
            self.a_attn,
            self.q,
            self.kv,
            self.nh,
            self.s,
            self.gqa,
            self.spec,
            self.quantized,
            self.autocast,
            self.key_cast,
            self.batch,
            self.gqa_repeat,
            self._sink_bytes(),
        )

    def _sink_bytes(self) -> int:
        """The bytes of gpt-oss's sink parameters, for ``cat``'s promotion: their dtype, or fp32 when they are
        16-bit in the other 16-bit dtype than autocast's (bf16 with fp16 promotes to fp32)."""
        b = self.dt_weight if self.base_trainable else self.dt_frozen
        other16 = self.autocast and {self.setup.dtype, self.setup.autocast} == {"bf16", "fp16"}
        return 4 if b == 2 and other16 else b

    def _attention_output_copied(self) -> bool:
        """Whether ``attn_output.transpose(1, 2).contiguous()`` copies the kernel's output before the output
        projection. Eager and math outputs are (b, heads, s, d) matmul results: always. Flash writes its
        output like its query (``empty_like``, which keeps the strides of a query that ``torch.cat`` made
        (b, heads, s, d): partial rotary, GPT-NeoX and Phi-3), so it copies after such a rotary. The
        memory-efficient kernel (fp32 queries) always allocates (b, s, heads, d) (aten/src/ATen/native/
        transformers/cuda/attention.cpp, ``_efficient_attention_forward``): the transpose is a view
        (pythia-1.4b QLoRA without autocast: +6.3% with a copy counted)."""
        if self.attn in ("eager", "math"):
            return True
        return self.spec.rotary_by_cat and self.attn == "flash" and self.a_attn == 2

    def _o_proj_input(self) -> None:
        """What the output projection's input leaves saved (its LoRA, a contiguous copy, casts)."""
        with self.adapter_owned():
            self._o_proj_saved()

    def _o_proj_saved(self) -> None:
        a, q, targets = self.a, self.q, self.targets
        o_name, adapter_cast, base_trainable = self.o_name, self.adapter_cast, self.base_trainable
        # eager, and flash after a rotary written with torch.cat (Phi-3): the kernel's output is laid out
        # (b, heads, s, d), so transpose(1, 2).contiguous() copies it before o_proj. (Under autocast with
        # an fp32 residual the attention output is already 16-bit: o_proj saves it without a cast; QLoRA's
        # bitsandbytes lora_A saves the 16-bit attention output itself, counted as attn.output.)
        # (the math kernel's output is a (b, heads, s, d) matmul result too)
        copies_output = self._attention_output_copied()
        output_counted = copies_output and (base_trainable or (o_name in targets and not adapter_cast))
        if output_counted:
            self.add("attn.output_for_o_proj", a * q, f"{a}·q")
        if self.spec.attention_output_gate:  # o_proj(attn · sigmoid(gate)): Qwen3-Next (cabe.linear_attention)
            linear_attention.add_output_gate(self, copies_output, output_counted)
        self._dropout_copy(o_name, copies_output)
        if self.a_attn != a and not copies_output and (base_trainable or o_name in targets):
            self.add("attn.output_cast_back", a * q, f"{a}·q")  # flash_attention_2's output, back to fp32
        if adapter_cast and o_name in targets:
            self.add(f"attn.{o_name}.lora_input_fp32", 4 * q, "4·q")
        if self.autocast and not self.four_bit and o_name in targets and not copies_output:
            # PEFT's Linear casts lora_A's input to fp32 even under autocast (_cast_input_dtype; only its
            # bitsandbytes layers skip it), and autocast casts that back: lora_A saves a new 16-bit copy
            self.add(f"attn.{o_name}.lora_input_cast", 2 * q, "2·q")

    def _dropout_copy(self, name: str, copies_output: bool) -> None:
        """Dropout's output before an output projection whose lora_A would read attention's own saved
        output (flash keeps it; no cast, no autocast): a copy of lora_A's own."""
        plain = not self.adapter_cast and not self.autocast
        if self.dropout and name in self.targets and not copies_output and (plain or self._bnb_direct(name, self.a)):
            self.add(f"attn.{name}.lora_dropout_output", self.a * self.q, f"{self.a}·q")

    def _rms_mlp(self) -> None:
        spec, h, f, a, rho, quantized = self.spec, self.h, self.f, self.a, self.rho, self.quantized
        base_trainable, targets, adapter_cast = self.base_trainable, self.targets, self.adapter_cast
        up_names, down_name = self.up_names, self.down_name
        wf = spec.norm_weight_fp32
        post_norm_only = spec.norm_placement == "post"
        sandwich = spec.norm_placement == "sandwich"
        # ---- MLP block -------------------------------------------------------------------------
        if post_norm_only:
            mlp_in_bytes = rho * h
        else:
            self.rms_norm("mlp_norm", h, "h", base_trainable, wf)
            mlp_in_bytes = rho * h
        if self.group.mlp == "moe" and (spec.expert_gate == "swiglu_clamp" or spec.expert_dispatch == "dense"):
            self.live = True  # NOTE: gpt-oss's and Llama 4's MoE blocks do not follow ``live``: counted whole
        if self.group.mlp == "moe" and spec.expert_gate == "swiglu_clamp":
            a_experts = self.dt_weight if base_trainable else self.dt_frozen
            router_in = 2 if self.autocast else rho  # under autocast F.linear saves its 16-bit cast of the input
            self.constant += _moe_clamped_swiglu(self.add, spec, f, a_experts, a, router_in, base_trainable)
        elif self.group.mlp == "moe" and spec.expert_dispatch == "dense":
            self._dense_experts()
        elif self.group.mlp == "moe":
            router_grad = base_trainable or any(lin.slot == "router" for lin, _ in self.wrapped.values())
            up_grad, down_grad = self._stack_grads()
            if spec.router == "sigmoid_groups":
                self._sigmoid_group_router(router_grad)
            # transformers' grouped_mm experts run in the experts' own dtype (see _moe)
            a_experts = self.dt_weight if base_trainable else self.dt_frozen
            # the router's input kept as it is: a trained base's (shared experts' linears save it too), or a
            # wrapped router's, unless DeepSeek's router saved its own fp32 cast instead (_sigmoid_group_router)
            keeps_x = base_trainable or (router_grad and not (spec.router == "sigmoid_groups" and rho != 4))
            # under autocast the router's F.linear saves its own 16-bit cast of x (autocast's lower-precision list)
            router_in = (2 if self.autocast else rho) if keeps_x else 0
            # the block's input requires grad (see ``live``), or a LoRA-wrapped router makes the routing weights do
            entry = self.live = self.live or router_grad
            _moe(self.add_owned, spec, f, a_experts, router_in, down_grad, rho, up_grad, live=entry)
            if entry or up_grad or down_grad:  # (no expert backward runs in the bottom layer without them)
                self.dispatch_workspace = _dispatch_workspace(self, a_experts)
            self._wrapped_parameters(a_experts, entry)
            self.live = entry or up_grad or down_grad
            if self.group.slot_names("shared_up"):
                self._shared_expert()
        else:
            self.linear_inputs("mlp", [(n, h) for n in up_names], mlp_in_bytes, f"{rho}·h")
            self.lora_mid(up_names)
            m = 4 if quantized else a  # Linear4bit returns its output in the input's dtype (fp32 here)
            self.add("mlp.gate_output", m * f, f"{m}·f")
            self.add("mlp.act_output", m * f, f"{m}·f")
            self.add("mlp.up_output", m * f, f"{m}·f")
            with self.adapter_owned():  # what down_proj (or its lora_A) saves: its input
                if quantized and self.autocast:
                    if down_name in targets:
                        self.add(f"mlp.{down_name}.input_cast", 2 * f, "2·f")
                elif base_trainable or (down_name in targets and not adapter_cast):
                    self.add("mlp.product", a * f, f"{a}·f")
                    self.product_saved = not self.autocast and not self.dropout
                if adapter_cast and down_name in targets:
                    self.add(f"mlp.{down_name}.lora_input_fp32", 4 * f, "4·f")
            self.note_lora_input(down_name, f, m)  # the product, in the MLP outputs' dtype
            self.lora_mid([down_name])
        if sandwich or post_norm_only:
            self.rms_norm("post_mlp_norm", h, "h", base_trainable, True)

    def _stack_grads(self) -> tuple[bool, bool]:
        """Whether the first expert stack (gate_up, reading the gathered tokens) and the second (down, reading the
        gated product) get a gradient: trained, or LoRA-wrapped (``ParamWrapper``) one by one. Their grouped_mm keeps
        its input only then (see :func:`_moe`)."""
        if self.base_trainable:
            return True, True
        stacks = [lin.name for lin in self.group.linears if lin.slot == "experts"]
        return bool(stacks) and stacks[0] in self.wrapped, len(stacks) > 1 and stacks[1] in self.wrapped

    def _wrapped_parameters(self, a_experts: int, live: bool = True) -> None:
        """PEFT's LoRA on bare parameters (``ParamWrapper``, peft/tuners/lora/layer.py 0.21.2). While the wrapped
        module runs, ``nn.utils.parametrize`` swaps the parameter for W' = W + s·ΔW: for an expert stack with one
        adapter ``_LoraFactorsProxy`` makes it with one ``baddbmm(W, lhs, rhs)`` (the factors cast to W's dtype),
        for a 2-D router ``_LoraParameterProxy`` adds the materialised delta. W' is a new tensor of the whole
        stack, and it requires grad: ``grouped_mm`` saves it (and, see :func:`_moe`, its input) for backward,
        where the gradient of W' — the stack's size again — exists before ``baddbmm``'s backward reduces it to
        the factors' gradients. Traced on a tiny DeepSeek-V3 (tests/trace/test_deepseek_trace.py)."""
        # in backward the stacks come in reverse order: down_proj's W' gradient first, while every W' is saved;
        # then gate_up's, once down_proj's grouped_mm has run and released its W' and down_proj's factors have
        # their gradients (autograd frees a node's saved tensors after it ran, torch/csrc/autograd/engine.cpp). The
        # layer's MLP moment counts every factor's gradient already (grads_mlp): the W' moments come before them.
        # ``live``: the experts' input requires grad; in the bottom layer of LoRA's path (``live`` false) grouped_mm
        # saves a stack's W' (for its input's gradient) only once an earlier wrapped stack made that input require it
        stacks = [(lin, m) for lin, m in self.wrapped.values() if lin.slot == "experts"]
        factors = [round_alloc(self.ad * sum(wrapped_adapter_sizes(lin, self.r, m))) for lin, m in stacks]
        released = made = 0
        for (lin, _), grads in zip(reversed(stacks), reversed(factors), strict=True):
            w = round_alloc(a_experts * lin.in_features * lin.out_features * lin.copies)
            self.backward_constant = max(self.backward_constant, w - released + made - sum(factors))
            released, made = released + w, made + grads
        x_live = live
        for lin, mult in self.wrapped.values():
            n = lin.in_features * lin.out_features * lin.copies
            if lin.slot == "experts":
                if x_live:
                    self.constant += round_alloc(a_experts * n)  # W', saved by grouped_mm
                x_live = True  # its output requires grad: the next stack's input does
                if self.ad != a_experts:  # lhs / rhs cast to W's dtype, saved by baddbmm
                    r = self.r * mult * lin.copies
                    self.constant += round_alloc(a_experts * r * lin.in_features)
                    self.constant += round_alloc(a_experts * r * lin.out_features)
            else:  # the router's W' (fp32: F.linear(x.float(), weight.float())) and its delta
                self.constant += 2 * round_alloc(4 * n)

    def _sigmoid_group_router(self, router_grad: bool) -> None:
        """DeepSeek-V3's router (transformers 5.24 ``DeepseekV3TopkRouter.forward``), beyond what :func:`_moe`
        counts for every router: ``F.linear(x.float(), weight.float())`` (the weight is kept fp32,
        ``_keep_in_fp32_modules_strict``) saves an fp32 cast of a 16-bit input for the weight's gradient
        (under autocast, the linear's own 16-bit cast); the ``topk(2)`` of each group saves its indices (int64),
        and so do the group ``topk`` and the expert ``topk``; ``masked_fill`` saves the boolean mask; the
        renormalisation saves the sum and the weights (fp32). Checked against saved-tensor hooks
        (tests/core_torch/test_saved_tensors.py)."""
        h, e, k, rho = self.h, self.spec.num_experts, self.spec.experts_per_token, self.rho
        groups, kept = self.spec.expert_groups
        if router_grad and rho != 4:
            cast = 2 if self.autocast else 4
            self.add("moe.router_input_cast", cast * h, f"{cast}·h")
        per = 16 * groups + 8 * kept + e + 8 * k + 4 + 4 * k
        self.add("moe.group_routing", per, "16·G + 8·G_k + E + 12·k + 4")

    def _dense_experts_backward(self) -> int:
        """The MoE block's backward workspace per token under dense dispatch: the routed experts' own
        (:meth:`_dense_experts`), or the shared expert's (a gated MLP's, see :meth:`rms_norm_block`), which runs
        first (its nodes were made after the experts', autograd runs the later ones first) while the copied
        gradient of the routed output (E·h) waits."""
        shared = 3 * self.a * self.f + 2 * self.rho * self.h
        return max(self.dense_experts_backward, self.copy_before_shared + shared)

    def _dense_experts(self) -> None:
        """Llama 4's MoE (``expert_dispatch == "dense"``; transformers 5.24 models/llama4/modeling_llama4.py,
        ``Llama4Router.forward``, ``Llama4TextMoe.forward``, ``Llama4TextExperts.forward``), per token:

        * the router (an ``nn.Linear``) and the shared expert's gate_proj and up_proj read the normed input x
          (saved once, or each its own 16-bit cast under autocast, when their weights train);
        * ``topk`` saves its int64 indices (8·k); ``sigmoid(scores.float())`` saves its fp32 output (4·E);
        * ``x.repeat(E, 1) * scores.transpose(0, 1).reshape(-1, 1)``: the multiply saves the repeated input (E·ρ·h)
          and the transposed scores' copy (E·a_r), both needed since the scores and x require grad;
        * ``bmm`` with ``gate_up_proj`` saves its input, the product (E·ρ·h, or autocast's 16-bit cast), when the
          experts train; ``gate_up`` (E·2f, kept whole by the activation's and the product's views of its halves),
          the activation's output (E·f) and, when ``down_proj`` trains, the product (E·f); ``bmm`` runs under
          autocast (it is on its lower-precision list), unlike transformers' grouped_mm;
        * the shared expert: a SwiGLU MLP of width f over the T tokens, no gate (:meth:`_shared_expert`).

        Every token goes through every expert: E× what the k picked experts would save."""
        spec, h, f, rho = self.spec, self.h, self.f, self.rho
        e, k, bt = spec.num_experts, spec.experts_per_token, self.base_trainable
        g = self.group
        readers = g.slot_names("router") + g.slot_names("shared_up")
        self.linear_inputs("moe", [(n, h) for n in readers], rho * h, f"{rho}·h")
        self.lora_mid(g.slot_names("shared_up"))
        ae = self.a if self.autocast else (self.dt_weight if bt else self.dt_frozen)  # the experts' bmm dtype
        self.add("moe.topk_indices", 8 * k, "8·k")
        self.add("moe.sigmoid_fp32", 4 * e, "4·E")
        self.add("moe.scores_column", ae * e, f"{ae}·E")
        self.add("moe.repeated_input", e * rho * h, f"E·{rho}·h")
        if bt:
            xe = 2 if self.autocast else rho
            self.add("moe.expert_input", e * xe * h, f"E·{xe}·h")
        self.add("moe.gate_up_output", e * 2 * ae * f, f"E·2·{ae}·f")
        self.add("moe.act_output", e * ae * f, f"E·{ae}·f")
        if bt:
            self.add("moe.product", e * ae * f, f"E·{ae}·f")
        self._shared_expert(inputs=False)
        # the routed experts' backward: sum(0)'s gradient is an expanded view, which the reshape back to (E·T, h)
        # copies (E·h); with it alive, bmm's backward makes the product's gradient (E·f), then MulBackward0 the
        # gradients of up and of the activation (2·E·f) beside it, once the saved product (when down_proj trains)
        # is released; later steps (SiluBackward0, the cat of the halves' gradients) release gate_up and the
        # activation's output as they make theirs. Per token: max(E·h + E·f, 3·E·f - the saved product)
        eh, ef = e * ae * h, e * ae * f
        self.dense_experts_backward = max(eh + ef, 3 * ef - (ef if bt else 0))
        self.copy_before_shared = eh

    def _shared_expert(self, inputs: bool = True) -> None:
        """A shared expert beside the routed ones (Qwen2-MoE, transformers 5 Qwen2MoeSparseMoeBlock.forward):
        a SwiGLU MLP over every token, times sigmoid(shared_expert_gate(x)); the product saves the MLP's
        output and the sigmoid's (one value per token). DeepSeek-V3's (``DeepseekV3MoE.forward``) and Llama 4's
        have no gate. ``inputs``: whether to count what its input projections save (False: counted already)."""
        g, h, a, quantized = self.group, self.h, self.a, self.quantized
        up, down = g.slot_names("shared_up"), g.slot_names("shared_down")[0]
        gate = g.slot_names("shared_gate")
        # the width of one of gate and up: two linears of fs (gate_proj, up_proj), or one fused 2·fs (Granite's
        # shared_mlp.input_linear, chunked in two)
        fs = sum(lin.out_features for lin in g.linears if lin.slot == "shared_up") // 2
        if inputs:
            # a trained base saves x once, as the router's input; under autocast each linear saves its own 16-bit
            # cast of x (traced: Qwen3-Next's gate_proj, up_proj and shared_expert_gate, 3 × 2·h per token)
            if not self.base_trainable or self.amp or (self.quantized and self.autocast):
                self.linear_inputs("shared", [(n, h) for n in up + gate], self.rho * h, f"{self.rho}·h")
            self.lora_mid(up + gate)
        m = 4 if quantized else a  # Linear4bit returns its output in the input's dtype (fp32 here)
        self.add("shared.gate_output", m * fs, f"{m}·{fs}")
        self.add("shared.act_output", m * fs, f"{m}·{fs}")
        self.add("shared.up_output", m * fs, f"{m}·{fs}")
        if self.base_trainable or (down in self.targets and not self.adapter_cast):
            self.add("shared.product", a * fs, f"{a}·{fs}")
        if self.adapter_cast and down in self.targets:
            self.add(f"shared.{down}.lora_input_fp32", 4 * fs, f"4·{fs}")
        self.lora_mid([down])
        if gate:  # (DeepSeek-V3's shared experts have no gate: their output is added as it is)
            self.add("shared.output", m * h, f"{m}·h")  # saved by the multiply with the sigmoid gate
            self.add("shared.gate_sigmoid", m, f"{m}")  # sigmoid's output, saved by sigmoid and the multiply
            if self.dispatch_workspace:
                # the gate's branch runs backward before the routed experts (Qwen3NextSparseMoeBlock.forward, 5.24
                # models/qwen3_next/modeling_qwen3_next.py:864, builds it last): MulBackward0 makes the shared
                # output's gradient (m·h, which waits for the shared MLP's backward) and releases the shared output
                # it saved (m·h); shared_expert_gate's backward releases what it saved of its input (autocast's
                # 16-bit cast, PEFT's fp32 one for lora_A, lora_A's output) and leaves the input's gradient (ρ·h, cast
                # back to the residual's dtype) waiting to be summed
                own = (f"shared.{gate[0]}.", f"lora.{gate[0]}.")
                released = sum(t.bytes_per_token for t in self.terms if t.name.startswith(own))
                self.dispatch_workspace += self.rho * h - released

    def layer_norm_block(self) -> int:
        """LayerNorm blocks with a plain GELU MLP (GPT-2, GPT-NeoX, Falcon). Returns the backward
        workspace per token."""
        self.block = "attn"
        self._ln_attention()
        self.mlp_from = len(self.terms)
        self.block = "mlp"
        self._ln_mlp()
        return 2 * self.a * self.f + 2 * self.rho * self.h  # backward workspace per token

    def _ln_attention(self) -> None:
        spec, h, rho, qkv_names = self.spec, self.h, self.rho, self.qkv_names
        ln_stats = 8  # mean and rstd, fp32 per token
        parallel = spec.parallel_block
        n_ln = spec.norms_per_layer
        if not self.live:  # the lowest layer of the gradient's path: no norm reading its input saves anything
            self.ln2_pending = not parallel and n_ln == 2  # the MLP's norm reads the residual after attention
        elif self.autocast and rho != 4:
            # layer_norm is on autocast's fp32 list: each norm saves its own fp32 cast of a 16-bit input
            self.add("ln.input_fp32", 4 * h * n_ln, f"{n_ln}·4·h" if n_ln > 1 else "4·h")
        else:
            formula = f"{rho}·h" if parallel or n_ln == 1 else f"{n_ln}·{rho}·h"
            self.add("ln.input", rho * h * (1 if parallel else n_ln), formula)
        self.add("ln.mean_rstd", ln_stats * n_ln, f"{n_ln}·8")
        self.input_live = self.live
        # one fused projection (GPT-2's c_attn), or separate q, k, v reading the same norm output (SigLIP's)
        self.linear_inputs("attn", [(n, h) for n in qkv_names], rho * h, f"{rho}·h")
        self.lora_mid(list(qkv_names))
        self._core()
        self._dense_input()
        if spec.hidden_dropout > 0:
            self.add("attn.resid_dropout_mask", h, "1·h")

    def _dense_input(self) -> None:
        """What the LayerNorm blocks' output projection (dense / c_proj) leaves saved."""
        with self.adapter_owned():
            self._dense_saved()

    def _dense_saved(self) -> None:
        a, q, targets = self.a, self.q, self.targets
        base_trainable, adapter_cast = self.base_trainable, self.adapter_cast
        out_name = self.o_name
        # eager, and flash after GPT-NeoX's partial rotary (torch.cat): the output is copied before dense
        copies_output = self._attention_output_copied()
        if copies_output and (base_trainable or (out_name in targets and not adapter_cast)):
            self.add("attn.output_for_dense", a * q, f"{a}·q")  # (an fp32 LoRA saves its own cast instead)
        self._dropout_copy(out_name, copies_output)
        if self.a_attn != a and not copies_output and (base_trainable or out_name in targets):
            self.add("attn.output_cast_back", a * q, f"{a}·q")  # flash_attention_2's output, back to fp32
        if self.autocast and not self.four_bit and out_name in targets and not copies_output:
            self.add(f"attn.{out_name}.lora_input_cast", 2 * q, "2·q")  # PEFT's fp32 cast, cast back
        if adapter_cast and out_name in targets:
            self.add(f"attn.{out_name}.lora_input_fp32", 4 * q, "4·q")
        self.lora_mid([out_name])  # lora_A's output, saved by lora_B (peft tuners/lora/layer.py Linear.forward)

    def _ln_mlp(self) -> None:
        spec, h, f, a, rho, quantized = self.spec, self.h, self.f, self.a, self.rho, self.quantized
        base_trainable, targets, adapter_cast = self.base_trainable, self.targets, self.adapter_cast
        up_names, down_name = self.up_names, self.down_name
        parallel, n_ln = spec.parallel_block, spec.norms_per_layer
        fc_name = up_names[0]
        if parallel:  # the MLP reads the layer's input through its norm, beside attention: not what attention made
            self.live = self.input_live
        elif self.ln2_pending and self.live:  # GPT-2's ln_2 on the residual attention made
            self.add(
                "ln2.input", (4 if self.autocast and rho != 4 else rho) * h, "4·h" if self.autocast else f"{rho}·h"
            )
            self.add("ln2.mean_rstd", 8, "8")
        if not parallel or n_ln == 2:
            self.linear_inputs("mlp", [(fc_name, h)], rho * h if n_ln == 2 else 0, f"{rho}·h")
        else:
            self.linear_inputs("mlp", [(fc_name, h)], 0, "")  # shares the attention block's LN output
        self.lora_mid([fc_name])
        chain = 4 if spec.activation in ("gelu_new", "gelu_fast") else 1
        down = down_name
        if chain > 1 and self.autocast:
            # NOTE: under autocast gelu_new's pow runs in fp32: x, tanh and the sum are fp32 copies; the
            # product is 16-bit, or fp32 when x itself is fp32 (QLoRA's Linear4bit output)
            self.add("mlp.gelu_tanh_chain_fp32", 3 * 4 * f, "3·4·f")
            pb = 4 if quantized else 2
            self.add("mlp.gelu_product", pb * f, f"{pb}·f")
            if base_trainable or down in targets:
                with self.adapter_owned():
                    self.add(f"mlp.{down}.input_cast", 2 * f, "2·f")
        else:
            m = 4 if quantized else a  # Linear4bit returns its output in the input's dtype (fp32 here)
            self.add("mlp.fc_output", m * f, f"{m}·f")
            if chain > 1:
                self.add("mlp.gelu_tanh_chain", (chain - 1) * a * f, f"{chain - 1}·{a}·f")
            if base_trainable or (down in targets and not adapter_cast):
                with self.adapter_owned():  # the input down (or its lora_A) saves
                    self.add("mlp.act_output", a * f, f"{a}·f")
        if adapter_cast and down in targets:
            with self.adapter_owned():
                self.add(f"mlp.{down}.lora_input_fp32", 4 * f, "4·f")
        self.lora_mid([down])  # lora_A's output, saved by lora_B, as for every other adapted module
        if spec.hidden_dropout > 0:
            self.add("mlp.dropout_mask", h, "1·h")


def _sym(n: int, spec: ModelSpec) -> str:
    if n == spec.hidden_size:
        return "h"
    if n == spec.q_dim:
        return "q"
    if n == spec.intermediate_size:  # NOTE: a narrower MLP (an MoE model's dense layers) shows its width
        return "f"
    return str(n)


def dora_stray_parameter(spec: ModelSpec, quantized: bool, adapter: int, frozen: int, lin: Linear) -> bool:
    """Whether DoRA with dropout on ``lin`` multiplies by a throwaway ``Parameter(W.T)`` that requires grad
    (see ``_Layer._dora_stray_parameter``): a Conv1D layer whose weight is already in the adapters' dtype."""
    return spec.conv1d and adapter == frozen and not (quantized and lin.quantized_by_bnb)


def fused_view_ok(quantized: bool, a: int, autocast: bool) -> bool:
    """Whether slices of a fused qkv output reach the attention kernel uncast (so the kernel saves views of
    it): always off QLoRA; under QLoRA only fp32 outputs without autocast (autocast casts bnb's fp32 output)."""
    return not quantized or (a == 4 and not autocast)


def _attention_core(
    add,
    attn: str,
    a: int,
    q: int,
    kv: int,
    nh: int,
    s: int,
    gqa: bool,
    spec: ModelSpec,
    quantized: bool = False,
    autocast: bool = False,
    key_cast: bool = False,
    batch: int = 1,
    gqa_repeat: bool = False,
    param_bytes: int = 4,
) -> None:
    if attn == "math":
        _math_attention_core(add, q, kv, nh, s, batch, gqa_repeat, spec.attention_dropout)
        return
    if attn == "eager" and spec.attention_sinks:
        _sink_attention_core(add, a, q, kv, nh, s, gqa, param_bytes, spec.attention_dropout)
        return
    # With QLoRA under autocast the fused output is fp32 and SDPA gets a 16-bit cast of v instead of the
    # view; without autocast and with fp32 queries nothing casts: v stays a strided view of the fused fp32
    # output, which the kernel saves (pythia-1.4b QLoRA, sdpa, no autocast: -7.9% without this).
    fused_view = spec.value_is_qkv_view and fused_view_ok(quantized, a, autocast)
    if attn == "efficient":
        _efficient_attention_core(add, a, q, kv, nh, s, gqa, spec, fused_view, key_cast)
        return
    if attn == "flash":
        add("attn.query", a * q, f"{a}·q")
        add("attn.key", a * kv, f"{a}·kv")
        if fused_view:
            # NOTE: v is a view of the fused qkv output (CUDA kernels take it strided): the whole storage
            # stays alive as long as v is saved
            add("attn.value_fused_qkv", a * (q + 2 * kv), f"{a}·(q + 2·kv)")
        else:
            add("attn.value", a * kv, f"{a}·kv")
        add("attn.output", a * q, f"{a}·q")
        add("attn.logsumexp", 4 * nh, "4·nh")
        return
    # What the two matmuls save. torch.matmul folds (b, heads, s, d) into bmm's (b·heads, s, d) with ``reshape``
    # (aten/src/ATen/native/LinearAlgebra.cpp, ``_matmul_impl``): a view only for one sequence (the strided
    # heads of a fused qkv, or the stride-0 heads of an expanded key, cannot merge with a batch dimension),
    # else a compact copy of every head. ``repeat_kv``'s ``expand(...).reshape(...)`` is a view for one kv head
    # (the size-1 kv dimension merges with the stride-0 repeat), a copy for more. So with b = 1 and one kv head
    # (or no grouping) the kernel keeps views: of the fused qkv output's whole storage where q / v are its
    # slices. (phi-3-mini QLoRA eager b8 s256 was +7.8% with the view at every batch; starcoderbase-3b QLoRA
    # eager b1 +5.8% with copies of k and v at b = 1.)
    # (an autocast cast of an expanded key is a full copy: ``_to_copy`` cannot keep stride-0 heads)
    uncast = fused_view_ok(quantized, a, autocast)
    shared = batch == 1 and (not gqa or (spec.num_kv_heads == 1 and uncast))
    kv_saved = kv if shared else q if gqa else kv
    kv_sym = "q" if kv_saved == q and kv != q else "kv"
    qkv_views = spec.qkv_views and uncast
    if qkv_views and shared:
        add("attn.qkv_fused", a * (q + 2 * kv), f"{a}·(q + 2·kv)")
    else:
        add("attn.query", a * q, f"{a}·q")
        add("attn.key", a * kv_saved, f"{a}·{kv_sym}")
    if qkv_views and shared:
        pass
    elif fused_view and shared:
        add("attn.value_fused_qkv", a * (q + 2 * kv), f"{a}·(q + 2·kv)")
    else:
        add("attn.value", a * kv_saved, f"{a}·{kv_sym}")
    if not spec.eager_softmax_fp32:  # NOTE: GPT-2's eager attention takes the softmax in the compute dtype
        sm = 4 if autocast else a  # ... but softmax is on autocast's fp32 list
        add("attn.softmax", sm * nh * s, f"{sm}·nh·s")
        if sm != a and not spec.attention_dropout > 0:
            # the second matmul (autocast's lower-precision list) casts the fp32 probabilities and saves the cast
            # (Llama 4's eager_attention_forward; GPT-2's casts them itself, .type(value.dtype)); with dropout the
            # matmul saves dropout's output instead (counted below)
            add("attn.probs", a * nh * s, f"{a}·nh·s")
    else:
        add("attn.softmax_fp32", 4 * nh * s, "4·nh·s")
        # NOTE: softmax(dtype=fp32).to(query.dtype): the cast is saved by the second matmul, unless dropout
        # follows it (dropout saves its mask only; the matmul saves dropout's output, counted below)
        if a != 4 and not spec.attention_dropout > 0:
            add("attn.probs", a * nh * s, f"{a}·nh·s")
    if spec.attn_logit_softcapping:
        add("attn.softcap_tanh", a * nh * s, f"{a}·nh·s")
    if spec.attention_dropout > 0:
        add("attn.dropout", (1 + a) * nh * s, f"(1+{a})·nh·s")


def _attention_forward_workspace(attn: str, a: int, nh: int, s: int) -> int:
    if attn == "eager":
        return 2 * a * nh * s  # raw scores and the masked scores before softmax
    return 0


def _efficient_attention_core(
    add, a: int, q: int, kv: int, nh: int, s: int, gqa: bool, spec: ModelSpec, fused_view: bool, key_cast: bool
) -> None:
    """Memory-efficient SDPA with a mask, as transformers calls it (integrations/sdpa_attention.py, 5.24:
    ``use_gqa_in_sdpa`` is false with a mask on CUDA, so ``repeat_kv`` materialises keys and values with every
    query head). PyTorch's CUDA branch of ``scaled_dot_product_attention`` (aten/src/ATen/native/transformers/
    attention.cpp) first turns the boolean mask into a new additive one of the query's dtype
    (``convert_boolean_attn_mask``: ``at::zeros_like`` + ``masked_fill_``; transformers' mask is a batch-expanded
    view, so the copy is b·s·s), pads and expands it (``preprocess_mask``, a view); the kernel saves q, k, v, that
    bias, its output, the fp32 logsumexp and the philox seed and offset.

    ``repeat_kv`` is ``expand(...).reshape(...)``: with one key/value head the reshape is a view (stride 0 over
    the heads) and nothing is copied, unless autocast then casts the expanded view (``key_cast``: a key that
    left the rotary product in the residual's dtype, cos and sin being cast to it)."""
    nkv = spec.num_kv_heads

    def kv_term(name: str, cast: bool) -> None:
        if gqa and (nkv > 1 or cast):
            add(name, a * q, f"{a}·q")
        else:
            add(name, a * kv, f"{a}·kv")

    add("attn.query", a * q, f"{a}·q")
    kv_term("attn.key", key_cast)
    if fused_view and not gqa:
        add("attn.value_fused_qkv", a * (q + 2 * kv), f"{a}·(q + 2·kv)")  # see _attention_core
    else:
        kv_term("attn.value", False)
    add("attn.output", a * q, f"{a}·q")
    add("attn.logsumexp", 4 * nh, "4·nh")
    s_pad = -(-s // 8) * 8  # preprocess_mask pads the last dimension to a multiple of 8
    add("attn.mask_bias", a * s_pad, f"{a}·s")


def _freed_before_attention_backward(layer: _Layer) -> int:
    """Bytes per token the MLP block saved, released before attention's backward starts.

    Autograd frees a node's saved tensors once it has run (torch/csrc/autograd/engine.cpp, ``call_function``
    then ``fn.release_variables()`` when the graph is not retained), and among ready nodes it runs the one
    created last first (``CompareNodeTaskTime``: higher ``sequence_nr`` first). The MLP is built after
    attention in every family's forward, sequential or parallel (Falcon, GPT-NeoX), so its nodes run first."""
    return sum(t.bytes_per_token for t in layer.terms[layer.mlp_from :])


def _math_attention_core(
    add, q: int, kv: int, nh: int, s: int, batch: int, gqa_repeat: bool = False, dropout: float = 0.0
) -> None:
    """What PyTorch's math SDPA kernel saves (``_scaled_dot_product_attention_math``, aten/src/ATen/native/
    transformers/attention.cpp, torch 2.13): fp32 copies of q (scaled), k and v, and the fp32 softmax.

    With fewer kv heads than query heads and no ``enable_gqa`` (Falcon's multi-query call), k and v reach
    ``at::matmul`` as (b, kv_heads, s, d) against (b, nh, s, d): ``_matmul_impl`` (aten/src/ATen/native/
    LinearAlgebra.cpp) broadcasts the batch dimensions with ``expand(...).reshape(...)``, which copies, and
    ``BmmBackward0`` saves the copies: k and v are kept at the query's width, 4·q each (the trace of falcon-7b
    lists two fp32 (b·71)×1024×64 clones per layer). With batch 1 the reshape merges a size-1 dimension
    with the stride-0 head dimension, a view: k and v stay 4·kv (the trace shows the kv-wide tensors).

    ``gqa_repeat``: the call had ``enable_gqa`` (:func:`sdpa_gqa_math`); the kernel starts with
    ``key.repeat_interleave(nh / kv_heads, -3)`` and the same for value, copies at the query's width, and
    the matmuls save the scaled key and that value: 4·q each at any batch.

    ``dropout``: the kernel drops the probabilities itself (``at::dropout(attn, dropout_p, true)`` after
    ``_safe_softmax``): ``native_dropout`` saves its 1-byte mask and the second matmul saves its fp32 output
    (starcoderbase-1b, attn_pdrop 0.1, QLoRA without autocast: −30.5% without them)."""
    broadcast = kv < q and (batch > 1 or gqa_repeat)
    wide = q if broadcast else kv
    sym = "q" if broadcast else "kv"
    add("attn.query_fp32_scaled", 4 * q, "4·q")
    add("attn.key_fp32", 4 * wide, f"4·{sym}")
    add("attn.value_fp32", 4 * wide, f"4·{sym}")
    add("attn.softmax_fp32", 4 * nh * s, "4·nh·s")
    if dropout > 0:
        add("attn.dropout", (1 + 4) * nh * s, "(1+4)·nh·s")


def _eager_backward_workspace(layer: _Layer, attn: str, a: int, nh: int, s: int) -> int:
    """Eager attention's backward beside all the layer saved (less its MLP's), per token. Autograd runs, in turn:

    - ``BmmBackward0`` of ``probs @ v``: the gradient of the probabilities (a·nh·s), then releases the saved
      16-bit probabilities (the ``.to(query.dtype)`` cast, when the softmax ran in fp32);
    - ``ToCopyBackward0`` of that cast: an fp32 copy of the gradient (4·nh·s), the 16-bit one freed after;
    - ``_softmax_backward_data``: its output in the softmax INPUT's dtype. ``softmax(x, dtype=float32)`` of an
      fp16 CUDA tensor runs ``_softmax(x, half_to_float=True)`` with no conversion (aten/src/ATen/native/
      SoftMax.cpp, torch 2.13, ``softmax(const Tensor&, int64_t, optional<ScalarType>)``: only for
      ``ScalarType::Half``), so the gradient comes back fp16 (a); a bf16 input is converted first
      (``input_.toType(dtype)``), so the gradient is fp32 (4) and ``ToCopyBackward0`` casts it after.
      Autocast's softmax (``fp32_set_opt_dtype``: the dtype argument set to fp32, the input left as it is)
      takes the same path: GPT-2's and Falcon's softmax under fp16 autocast too.

    So the workspace is a (the probabilities' gradient) beside everything saved; then 4 + 4 − a (fp16:
    4 + a − a) with the probabilities gone; without a cast (fp32 queries, or a softmax in the compute dtype)
    the gradient and softmax's backward output, 2a. pythia-6.9b LoRA fp16 eager: 2a + 4 counted the
    probabilities' gradient, their fp32 copy and a backward output all beside the saved probabilities, +6.3%
    against the trace; llama-2-7b bf16: +1.4%. gpt-oss's sink attention (softmax in the sinks' promoted dtype,
    sliced before the cast) keeps the bound 2a + 4 of an fp32 softmax."""
    if attn != "eager":
        return 0
    spec = layer.spec
    if spec.attention_sinks:
        return (2 * a + (4 if a != 4 else 0)) * nh * s
    softmax = 4 if spec.eager_softmax_fp32 or layer.autocast else a
    if softmax == a:
        return 2 * a * nh * s
    # the scores are fp16 when matmul's output is and, in the families whose eager attention adds a float causal
    # mask made in the embeddings' dtype (masking_utils.py ``eager_mask``: ``torch.where(mask, 0.0,
    # min_dtype).to(dtype)``), that mask is fp16 too; any other pair promotes them to fp32 before the softmax
    fp16 = _compute_dtype(layer) == "fp16"
    if spec.eager_softmax_fp32:
        fp16 = fp16 and layer.setup.dtype == "fp16" and layer.rho == 2
    return max(a, 4, 4 if fp16 else 8 - a) * nh * s


def _compute_dtype(layer: _Layer) -> str:
    """The name of the matmuls' output dtype (``Dtypes.compute`` as a dtype): autocast's, an engine's gathered
    parameter dtype, or the weights' own."""
    setup = layer.setup
    if layer.a == 4:
        return "fp32"
    if layer.autocast:
        return setup.autocast
    if setup.param_dtype != "none":
        return setup.param_dtype
    return setup.dtype


def _math_backward_workspace(attn: str, nh: int, s: int) -> int:
    """PyTorch's math SDPA kernel (``_scaled_dot_product_attention_math``, aten/src/ATen/native/transformers/
    attention.cpp, torch 2.13) computes in fp32 on CUDA. Its backward first makes the gradient of the
    probabilities (``BmmBackward0``: grad_out @ vᵀ, fp32 nh·s per token), then ``_safe_softmax``'s backward
    (tools/autograd/derivatives.yaml: ``_softmax_backward_data(grad, result, ...)``) writes the gradient of
    the scores, fp32 again, while the first is still alive: two fp32 s×s tensors beside the saved softmax."""
    return 2 * 4 * nh * s if attn == "math" else 0


def _moe(
    add,
    spec: ModelSpec,
    f: int,
    a: int,
    router_in: int,
    experts_grad: bool,
    rho: int = 0,
    up_grad: bool | None = None,
    live: bool = True,
) -> None:
    """Routed experts as transformers 5 runs them by default (``grouped_mm``, integrations/moe.py 5.24:
    ``grouped_mm_experts_forward``). ``a`` is the experts' weight dtype, not autocast's: ``_grouped_mm`` casts
    the gathered tokens to ``weight.dtype`` and calls ``torch.nn.functional.grouped_mm``, which is not
    autocast-enabled (its comment cites pytorch#174763) — fp32 experts (fp32 weights under autocast, QLoRA's
    unquantized 3-D experts after prepare_model_for_kbit_training) compute and save in fp32.

    ``experts_grad``: the second stack (down_proj) gets a gradient, so its grouped_mm saves its input (the gated
    product); ``up_grad`` (default: the same): the first (gate_up_proj) does, so its grouped_mm saves the gathered
    tokens. ``GroupedMmBackward0`` keeps the input only for the weight's gradient (torchgen/packaged/autograd/
    derivatives.yaml:1223, torch 2.13: only ``mat2``'s formula reads ``self``, saved when ``mat2`` requires grad): a
    LoRA ``ParamWrapper`` on down_proj alone saves no gathered tokens (traced: tiny Qwen3-Next, LoRA on down_proj and
    out_proj, +4.1% with them, +0.1% without).

    ``live``: the block's input requires grad. Without it (the bottom layer of LoRA's path, ``_Layer.live``) the
    router's softmax and top-k save nothing, a wrapped gate_up makes everything after it require grad, and the
    routing ``mul`` keeps no expert output (the routing weights need no gradient); a wrapped down_proj alone keeps
    only its input (traced: Qwen3-30B-A3B, 4 layers, LoRA on down_proj without checkpointing: +4.8% before)."""
    up_grad = experts_grad if up_grad is None else up_grad
    h, e, k = spec.hidden_size, spec.num_experts, spec.experts_per_token
    if router_in:  # the router's weight gets a gradient (trained, or LoRA-wrapped): its input is kept
        add("moe.router_input", router_in * h, f"{router_in}·h")
    if spec.router == "topk_softmax_fp32" and live:
        # Granite's GraniteMoeHybridTopKRouter (transformers 5.24): top-k of the fp32 logits (int64 indices), a
        # softmax over the k in fp32 (saved), its cast to the input's dtype (the routing weights); grouped_mm's
        # dispatch saves the pairs' token index (``// k``), the sort permutation and its inverse (int64 each)
        add("moe.routing", 8 * k * 4 + 4 * k, "36·k")
        add("moe.routing_weights", rho * k, f"{rho}·k")  # gathered per pair, in the input's dtype (ρ)
    elif live:
        add("moe.router_softmax", 4 * e, "4·E")
        add("moe.routing", 8 * k * 3 + 4 * k, "28·k")
    if up_grad:  # the same for the experts' weights
        add("moe.expert_input", k * a * h, f"k·{a}·h")  # gathered tokens, kept for the expert weight grads
    if live or up_grad:
        add("moe.gate_up_output", k * 2 * a * f, f"k·2·{a}·f")
        add("moe.act_output", k * a * f, f"k·{a}·f")
    if experts_grad:
        add("moe.product", k * a * f, f"k·{a}·f")
    if live:
        add("moe.expert_output", k * a * h, f"k·{a}·h")


def _sink_attention_core(
    add, a: int, q: int, kv: int, nh: int, s: int, gqa: bool, sink_bytes: int, dropout: float
) -> None:
    """Eager attention with learned sinks (``attention_sinks``; transformers 5.24,
    models/gpt_oss/modeling_gpt_oss.py, ``eager_attention_forward``): ``repeat_kv`` copies k and v to every
    query head (``expand(...).reshape(...)``); the scores get the sink logits as one more column
    (``torch.cat([attn_weights, sinks])``), minus their row maximum (``max(dim=-1)`` saves its int64 indices),
    and ``softmax(..., dtype=combined_logits.dtype)`` saves its output with that column: s + 1 values per
    head, in the wider of the scores' and the sinks' dtypes: ``cat`` promotes (autocast's promote list, and
    ``torch.cat``'s own type promotion without it), so 16-bit scores become fp32 with fp32 sinks (fp32 weights
    under autocast, or QLoRA's k-bit preparation) and stay 16-bit with 16-bit sinks (bf16 weights under
    autocast: gpt-oss-20b prompt tuning, ``--dtype auto --autocast bf16``, was +12.6% when this was read as
    fp32 under any autocast). ``sink_bytes`` is the sinks' parameter dtype. The second matmul saves the probabilities without the sink column: a view
    of the softmax output, or, under autocast, the ``.to(value_states.dtype)`` cast of it (a·nh·s)."""
    kv_saved, sym = (q, "q") if gqa else (kv, "kv")
    add("attn.query", a * q, f"{a}·q")
    add("attn.key", a * kv_saved, f"{a}·{sym}")
    add("attn.value", a * kv_saved, f"{a}·{sym}")
    add("attn.sink_max_indices", 8 * nh, "8·nh")
    sm = max(a, sink_bytes)
    add("attn.softmax_with_sink", sm * nh * (s + 1), f"{sm}·nh·(s+1)")
    if dropout > 0:  # dropout(probs[..., :-1]).to(v's dtype): the mask, and the matmul's input
        add("attn.dropout", (1 + a) * nh * s, f"(1+{a})·nh·s")
    elif sm != a:
        add("attn.probs", a * nh * s, f"{a}·nh·s")


def _moe_clamped_swiglu(
    add, spec: ModelSpec, f: int, a: int, a_router: int, router_in: int, base_trainable: bool
) -> int:
    """gpt-oss's experts (``expert_gate == "swiglu_clamp"``, ``router == "topk_softmax"``) as transformers 5.24
    runs them by default (integrations/moe.py, ``grouped_mm_experts_forward`` with biases; models/gpt_oss/
    modeling_gpt_oss.py, ``GptOssTopKRouter.forward`` and ``GptOssExperts._apply_gate``). ``a`` is the experts'
    dtype (grouped_mm runs outside autocast, see :func:`_moe`), ``a_router`` the router's output dtype,
    ``router_in`` the bytes of the router's saved input (the residual's, or autocast's 16-bit cast).

    Router: ``F.linear`` with a bias saves its input when the weight trains; ``topk`` of the logits saves its
    int64 indices (8·k) and the softmax over the k values saves its output (a_router·k). Dispatch: ``sort``'s
    permutation (the routing weights' gather index), ``perm // k`` (the tokens' gather index), the sorted expert
    ids (the biases' gather index, saved only when the biases train) and the inverse permutation, int64 each
    (4·8·k or 3·8·k); the routing weights gathered per pair (a_router·k); the int32
    offsets over the experts (one small tensor per layer: returned as a per-layer constant).
    Experts per pair: the gathered tokens (for the weight gradient), the interleaved gate_up output (2f, kept by
    the clamps of its strided halves), the clamped gate, ``sigmoid(alpha·gate)``, their product, ``up + 1``
    (f each), the gated product (saved by down_proj's grouped_mm when it trains) and down_proj's output (h,
    saved by the multiplication with the routing weights)."""
    h, k = spec.hidden_size, spec.experts_per_token
    if base_trainable:
        add("moe.router_input", router_in * h, f"{router_in}·h")
    add("moe.topk_indices", 8 * k, "8·k")
    add("moe.topk_softmax", a_router * k, f"{a_router}·k")
    n_idx = 4 if base_trainable else 3  # the biases' gather saves its index only when the biases train
    add("moe.dispatch_indices", n_idx * 8 * k, f"{n_idx * 8}·k")
    add("moe.routing_weights", a_router * k, f"{a_router}·k")
    if base_trainable:
        add("moe.expert_input", k * a * h, f"k·{a}·h")
    add("moe.gate_up_output", k * 2 * a * f, f"k·2·{a}·f")
    add("moe.clamped_gate_sigmoid_glu_up", k * 4 * a * f, f"k·4·{a}·f")
    if base_trainable:
        add("moe.product", k * a * f, f"k·{a}·f")
    add("moe.expert_output", k * a * h, f"k·{a}·h")
    return round_alloc(4 * spec.num_experts)  # the int32 offsets (torch.cumsum of the histogram)


def checkpointed_layer_bytes_per_token(dt: Dtypes) -> int:
    """With gradient checkpointing, a layer keeps only its input: the residual stream (ρ·h)."""
    return dt.residual


@dataclass(frozen=True)
class HeadActivations:
    final_norm: int  # saved by the final norm (per token)
    logits: int  # lm_head output kept until the loss is done (per token)
    saved_logsoftmax: int  # log-softmax output saved for backward (per token)
    forward_peak_extra: int  # transient fp32 upcast at the loss (per token)
    backward_peak_extra: int  # grads of log-softmax and of the logits at the head's backward
    # bytes that do not scale with all the tokens: one chunk's transients (chunked / fused losses)
    forward_fixed: int = 0
    backward_fixed: int = 0


def head_activations(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> HeadActivations:
    """The final norm and the loss, by loss kernel (``setup.resolved_loss``)."""
    if spec.head == "sequence_classification":
        return _classifier_head(spec, setup, dt)
    h, v = spec.hidden_size, spec.vocab_size
    rho = dt.residual
    a = dt.compute
    full = setup.method == "full"
    if spec.norm == "rmsnorm":
        final_norm = 4 * h + 4 + (rho * h if full else 0) + (rho * h if full else 0)
    else:
        ln_in = 4 if dt.autocast else rho  # autocast runs layer_norm on an fp32 cast of its input
        final_norm = ln_in * h + 8 + (rho * h if full else 0)
    final_norm += lm_head_lora_saved(spec, setup, dt) + lm_head_saved_input(spec, setup, dt)
    if spec.hyper_connections:  # DeepSeek-V4's hc_head and fp32 final norm (cabe.compressed_attention)
        final_norm += compressed_attention.head_saved(spec, rho, dt.autocast, full)
    # Gemma 2's final soft-capping (logits / cap, tanh, × cap) saves tanh's 16-bit output
    softcap = a * v if spec.final_logit_softcapping else 0
    loss = setup.resolved_loss
    if loss == "chunked":
        return _chunked_loss(final_norm, softcap, v, a, setup)
    if loss in ("liger", "cce"):
        return _fused_linear_loss(loss, final_norm, rho * h if full else 0, spec, setup, dt)
    return _hf_loss(final_norm, softcap, v, a)


def _adapter_input(dt: Dtypes) -> tuple[int, int]:
    """(bytes per element of what lora_A saves of its input, of lora_A's output that lora_B saves) for an adapted
    ``Linear`` whose base weight is frozen (peft 0.21 tuners/lora/layer.py ``Linear.forward``: ``x =
    self._cast_input_dtype(x, lora_A.weight.dtype)``, then ``lora_B(lora_A(dropout(x)))``): under autocast the
    16-bit casts; else the input in the adapters' dtype (its own copy when that is not the compute dtype)."""
    if dt.autocast:
        return 2, 2
    return (dt.adapter if dt.adapter != dt.compute else dt.compute), dt.adapter


def lm_head_lora_saved(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """Bytes per token a LoRA on the lm_head saves (the frozen base saves nothing of its input): lora_A's
    input (the final norm's output, cast as :func:`_adapter_input` says) and lora_A's output (r values);
    with dropout, CUDA's 1-byte mask and the dropped copy in place of the input."""
    if not setup.adapters or not any(t.kind == "lm_head" for t in head_targets(spec, setup.lora_targets)):
        return 0
    h, r = spec.hidden_size, setup.lora_rank
    x, mid = _adapter_input(dt)
    if setup.lora_dropout > 0:
        x = 2 if dt.autocast else dt.adapter  # nn.Dropout's output in the adapters' dtype (cast under autocast)
        return x * h + h + mid * r
    return x * h + mid * r


def lm_head_saved_input(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """Bytes per token the lm_head's matmul saves of its input when ``modules_to_save`` trains a copy of it
    (cabe.method.saved_modules): the final norm's output, or autocast's 16-bit cast of it."""
    if not any(t.kind == "lm_head" for t in saved_modules(spec, setup)):
        return 0
    return (2 if dt.autocast else dt.residual) * spec.hidden_size


def embedding_lora_saved(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """Bytes per token a LoRA on the token embedding saves until backward reaches it (peft 0.21
    tuners/lora/layer.py ``Embedding.forward``: ``after_A = F.embedding(x, lora_embedding_A.T)``, which saves
    only the ids the batch already holds, then ``(after_A @ lora_embedding_B.T) * scaling``, whose matmul saves
    ``after_A``, r values per token, or autocast's 16-bit cast of it)."""
    if not setup.adapters or not any(t.kind == "embedding" for t in head_targets(spec, setup.lora_targets)):
        return 0
    return (2 if dt.autocast else dt.adapter) * setup.lora_rank


def _hf_loss(final_norm: int, softcap: int, v: int, a: int) -> HeadActivations:
    """transformers' ForCausalLMLoss (loss/loss_utils.py, l. 51-73): ``logits.float()`` of the whole
    b·s×V logits, then ``cross_entropy`` (log-softmax saved in fp32, nll_loss)."""
    return HeadActivations(
        final_norm=final_norm,
        logits=a * v,
        saved_logsoftmax=4 * v + softcap,
        forward_peak_extra=0 if a == 4 else 4 * v,
        # nll_loss's gradient (a zeroed fp32 b·s×V, scattered) + log-softmax's input gradient (fp32)
        backward_peak_extra=4 * v + 4 * v,
    )


def loss_chunk_tokens(setup: TrainingSetup) -> tuple[int, int]:
    """torchtune's chunks (``tensor_split(n, dim=1)``; its ``chunk`` of the hidden states agrees when n
    divides s): s mod n chunks of ceil(s/n) positions, then floor(s/n) ones. Returns (tokens of the
    largest chunk, tokens of the last chunk), batch included."""
    s, n = setup.tokens_per_sequence, setup.loss_chunks
    return setup.batch * -(-s // n), setup.batch * (s // n)


def _chunked_loss(final_norm: int, softcap: int, v: int, a: int, setup: TrainingSetup) -> HeadActivations:
    """torchtune's CEWithChunkedOutputLoss (modules/loss/ce_chunked_output_loss.py, l. 65-100) over
    ``TransformerDecoder.chunked_output``: every logits chunk stays (together a·V per token), each is
    upcast and log-softmaxed in turn, so only one chunk's fp32 copy is transient; the log-softmax of every
    chunk is saved. Backward runs chunk by chunk from the last: its nll and log-softmax gradients (fp32)."""
    full_chunk, last = loss_chunk_tokens(setup)
    upcast = 0 if a == 4 else round_alloc(4 * v * last)
    # backward of the last chunk (every log-softmax still saved), or of the one before it (one fewer saved)
    before_last = max(8 * v * last, 8 * v * full_chunk - 4 * v * last)
    return HeadActivations(
        final_norm=final_norm,
        logits=a * v,
        saved_logsoftmax=4 * v + softcap,
        forward_peak_extra=0,
        backward_peak_extra=0,
        forward_fixed=upcast,
        backward_fixed=before_last,
    )


def _fused_linear_loss(
    loss: str, final_norm: int, head_input: int, spec: ModelSpec, setup: TrainingSetup, dt: Dtypes
) -> HeadActivations:
    """Fused linear cross-entropy: the logits are never whole (modelled from the kernels' source; Triton,
    not traceable on a CPU).

    * ``liger``: LigerFusedLinearCrossEntropyFunction (liger_kernel/ops/fused_linear_cross_entropy.py,
      ``fused_linear_cross_entropy_forward``): ``grad_input = zeros_like(_input)`` (b·s×h in the input's
      dtype) and fp32 ``loss_1d`` (b·s); chunks of ``next_power_of_2(ceil(b·s / ceil(V/h)))`` rows, each
      ``_input_chunk @ weight.t()`` (chunk×V in the compute dtype, its gradient written in place by the
      Triton kernel) and its ``grad_logits_chunk @ weight`` (chunk×h); the gradients are made in forward and
      saved, so the lm_head's input is not.
    * ``cce``: cut_cross_entropy/cce.py, ``LinearCrossEntropyFunction``: saves ``e`` (the final norm's output,
      kept even when the lm_head is frozen), the fp32 log-sum-exp (b·s) and the valid indices; backward's
      kernel writes ``de`` (b·s×h) blockwise, with no b·s×V tensor.
    """
    h, v, a, rho = spec.hidden_size, spec.vocab_size, dt.compute, dt.residual
    tokens = setup.batch * setup.tokens_per_sequence
    if loss == "liger":
        inc = -(-v // h)
        chunk = min(1 << max(0, (-(-tokens // inc) - 1).bit_length()), tokens)
        # a trained lm_head: grad_weight = zeros_like(weight), made in forward and saved until backward
        grad_weight = round_alloc(v * h * dt.grad) if setup.method == "full" else 0
        return HeadActivations(
            final_norm=final_norm - head_input,
            logits=0,
            saved_logsoftmax=rho * h,
            forward_peak_extra=4,
            backward_peak_extra=0,
            forward_fixed=round_alloc(a * v * chunk) + round_alloc(a * h * chunk) + grad_weight,
            backward_fixed=grad_weight,
        )
    return HeadActivations(
        final_norm=final_norm - head_input,
        logits=0,
        saved_logsoftmax=rho * h + 4 + 8,  # e, lse (fp32), valids (int64)
        forward_peak_extra=4,  # the negated dot products, then the nll, per token (fp32)
        backward_peak_extra=rho * h,  # de
        forward_fixed=round_alloc(4 * v),  # logit_avg (fp32, V) for the gradient filter
        backward_fixed=0,
    )


def korthikanti(spec: ModelSpec, setup: TrainingSetup) -> int:
    """The textbook per-layer estimate s·b·h·(34 + 5·a·s/h) bytes (16-bit, no recompute)."""
    s, b, h, nh = setup.seq, setup.batch, spec.hidden_size, spec.num_heads
    return int(s * b * h * (34 + 5 * nh * s / h))


def _classifier_head(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> HeadActivations:
    """A sequence-classification encoder (BERT): no logits per token. ``final_norm`` stands for the
    embeddings' LayerNorm and dropout (``BertEmbeddings``), which save, per token, the norm's input
    (fp32 under autocast, layer_norm being on its fp32 list), its mean and rstd (8) and the dropout's
    1-byte mask — only when the embeddings train. The pooler and classifier save b·h and b·labels
    elements per *sequence* (the first token): under 0.1 % of a layer, not counted."""
    if setup.method != "full":
        return HeadActivations(0, 0, 0, 0, 0)
    h = spec.hidden_size
    ln_in = 4 if dt.autocast else dt.residual
    mask = h if spec.embedding_dropout > 0 else 0
    return HeadActivations(
        final_norm=ln_in * h + 8 + mask, logits=0, saved_logsoftmax=0, forward_peak_extra=0, backward_peak_extra=0
    )


def _dispatch_workspace(layer: _Layer, a_experts: int) -> int:
    """The routed experts' backward at its largest, before any MLP gradient exists, per token (transformers 5.24
    integrations/moe.py:524-536, ``grouped_mm_experts_forward``): ``weighted_out[inv_perm]`` then
    ``.view(T, k, h).sum(dim=1)``. Backward, ``SumBackward1`` expands the gradient (a view) and ``ViewBackward0``
    reshapes the expanded tensor, a copy (k·a_e·h); ``IndexBackward0`` is ``index_backward(grad.new_zeros(...),
    indices, grad)`` (tools/autograd/derivatives.yaml, torch 2.13): zeros and the out-of-place ``index_put`` beside
    them (k·a_e·h each) — three tensors of every token-expert pair in the experts' dtype, with the layer's incoming
    gradient (ρ·h) and every tensor the layer saved still alive (``MulBackward0`` with the routing weights that
    follows holds three as well, once the copy and the zeros are freed). A cast back to the residual's dtype
    (``final_hidden_states.to(hidden_states.dtype)``) adds the gradient in the experts' dtype. A tiny Qwen3-Next
    checkpointed, bf16, batch 8 × 512: the trace's peak is this moment (−6.2% without it)."""
    spec, h, rho = layer.spec, layer.h, layer.rho
    k = spec.experts_per_token
    return rho * h + 3 * k * a_experts * h + (a_experts * h if a_experts != rho else 0)
