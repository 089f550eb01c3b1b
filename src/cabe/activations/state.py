"""One decoder layer being counted: what the rooms have saved so far, and the operations every room uses.

:class:`LayerState` holds the request's decisions for the layer (``facts``, a :class:`cabe.facts.LayerFacts`,
resolved once) and what the rooms write as they walk the layer's forward: the saved :class:`Term` list, the saved
bytes that do not grow with tokens, the transients of moments inside the layer, and ``live`` — whether the tensor
flowing through the block being counted requires grad (the bottom-layer rule, below). Proved through every room's
trace test; the bottom-layer rule by tests/trace/test_bottom_layer.py.
"""

from __future__ import annotations

from cabe import memo
from cabe.activations.terms import Term
from cabe.architecture import ModelSpec
from cabe.facts import LayerFacts
from cabe.layers import Linear


class LayerState:
    """The saved tensors of one decoder layer, term by term, as the rooms add them."""

    def __init__(self, facts: LayerFacts) -> None:
        self.facts = facts
        self.q = facts.spec.q_dim  # the width the output projection reads (latent and linear attention narrow it)
        self.backward_constant = 0  # a backward transient that does not grow with tokens (per layer)
        self.block = ""  # the block being counted ("attn" / "mlp"): GPT-2's two c_proj share a name
        self.dora_norm_bytes = 0  # the largest of the adapted modules' weight-norm transients
        self.dora_result_moment = 0  # bytes: see adapters._note_dora_result
        self.input_copies: dict[str, int] = {}  # per token: PEFT's copies of an adapted module's input
        self.lora_pending: dict[str, int] = {}  # per token: see adapters.note_lora_input
        self.stray_grads = self.stray_grads_mlp = 0  # DoRA + dropout on Conv1D (see adapters._dora_stray_parameter)
        self.terms: list[Term] = []
        self.saved = 0  # bytes per token of every term so far (terms are only ever appended, by add)
        self.by_name = _by_name(facts)  # the group's linears by name (see linear)
        self.constant = 0  # saved bytes per layer that do not grow with tokens
        self.mlp_from = 0  # the first term of the MLP block
        self.product_saved = False
        self.down_input = 0  # per token: what the MLP's output projection (its lora_A) alone saved of its input
        self.dense_experts_backward = 0  # the routed experts' own backward transient (expert_dispatch "dense")
        self.copy_before_shared = 0
        # a saved term that is the layer's input storage itself (see LayerActivations.input_alias_per_token)
        self.input_alias = 0  # the gated MLP's product is saved as it is (not a cast of it) by down_proj
        # a linear-attention mixer's kernel transients per token, forward and backward (activations.deltanet)
        self.mixer_forward = self.mixer_backward = 0
        self.indexer_transient = 0  # per token: DeepSeek-V3.2's indexer (see latent._indexer_transient)
        self.indexer_from = 0  # the first term saved after the indexer ran
        self.dispatch_workspace = 0  # per token: the grouped_mm experts' backward (see moe.dispatch_workspace)
        self.experts_freed = 0  # per token: see LayerActivations.experts_freed_per_token
        self.experts_from = 0  # the first term the routed experts save after their input (activations.compressed)
        self.output_grad = 0  # per token: see LayerActivations.output_grad_per_token
        self.gathered = self.gathered_mlp = 0  # per token: see LayerActivations.gathered_input_per_token
        self.stream_at: list[int] = []  # the terms on the residual stream, by index (LayerActivations.stream_per_token)
        # compressed attention's softmax: the moment's bytes, the first term after it, its backward (compressed)
        self.softmax_moment = self.softmax_at = self.softmax_backward = 0
        # Whether the tensor flowing through the block being counted requires grad. Autograd saves a tensor for an
        # op only when one of the op's inputs requires grad (torch/csrc/autograd: a node is recorded only then), so
        # in the lowest layer of LoRA's gradient path without checkpointing — its input, the frozen embedding's
        # output, requires none — nothing is saved until an adapted module's output joins the stream: its norms,
        # attention kernel and MLP save nothing below that point, and only what the adapters save for their own
        # weights' gradients is kept (``owned``). Blocks that do not follow ``live`` set it first (their old count).
        self.live = not facts.bottom
        self.owned = 0  # > 0 while counting what an adapted module saves for its own weights (kept in any case)
        self.input_live = self.live  # LayerNorm blocks: whether the layer's input (what a parallel MLP reads) is live
        self.ln2_pending = False  # GPT-2's second norm, on the residual after attention: counted if that is live

    def add(self, name: str, nbytes: int, formula: str) -> None:
        if nbytes and (self.live or self.owned):
            self.terms.append(_term(Term, (name, nbytes, formula)))  # Term(name, nbytes, formula), without its __new__
            self.saved += nbytes

    def add_stream(self, name: str, nbytes: int, formula: str) -> None:
        """A term of the residual stream's width and length (a norm's input, output or statistics, a dropout mask on
        the stream): whole on every GPU under tensor parallelism (LayerActivations.stream_per_token)."""
        if nbytes and (self.live or self.owned):  # (add's test, inlined: a layer adds a dozen of these per estimate)
            self.stream_at.append(len(self.terms))
            self.terms.append(_term(Term, (name, nbytes, formula)))
            self.saved += nbytes

    def add_owned(self, name: str, nbytes: int, formula: str) -> None:
        """A term kept whether or not the block is ``live`` (its caller decides: :func:`cabe.activations.moe._moe`)."""
        with self.adapter_owned():
            self.add(name, nbytes, formula)

    def adapter_owned(self) -> LayerState:
        """What is added inside is saved by an adapted module for its own weights' gradients: kept in the lowest
        layer of the gradient's path too (see ``live``). The layer is its own context (a generator-based context
        manager costs three times as much, and a layer enters it a dozen times per estimate)."""
        return self

    def __enter__(self) -> None:
        self.owned += 1

    def __exit__(self, *exc: object) -> None:
        self.owned -= 1

    def joins(self, names: list[str]) -> None:
        """An adapted module among ``names`` adds its LoRA output to the stream: what follows requires grad."""
        if not self.live and any(n in self.facts.targets for n in names):
            self.live = True

    def linear(self, n: str) -> Linear | None:
        """The layer's linear named ``n``, the one of the block being counted when two share the name (GPT-2 and
        GPTBigCode call both output projections ``c_proj``: 768 -> 768 in attention, 3072 -> 768 in the MLP)."""
        same = self.by_name.get(n, ())
        if len(same) < 2:  # (one linear of that name is the answer whatever its role)
            return same[0] if same else None
        return next((lin for lin in same if lin.role == self.block), same[-1])


_term = tuple.__new__


def _by_name(facts: LayerFacts) -> dict[str, tuple[Linear, ...]]:
    """The group's linears by name, in order: once per model and group (cabe.memo; the group kept by the entry)."""
    m, key = memo.of(facts.spec), ("linears_by_name", id(facts.group))
    hit = m.get(key)
    if hit is None:
        by: dict[str, tuple[Linear, ...]] = {}
        for lin in facts.group.linears:
            by[lin.name] = (*by.get(lin.name, ()), lin)
        hit = m[key] = (facts.group, by)
    return hit[1]


def sym(n: int, spec: ModelSpec) -> str:
    if n == spec.hidden_size:
        return "h"
    if n == spec.q_dim:
        return "q"
    if n == spec.intermediate_size:  # NOTE: a narrower MLP (an MoE model's dense layers) shows its width
        return "f"
    return str(n)
