"""The request, declared once: every field a training or serving request can carry.

Each :class:`Field` says its name (snake_case, the same in JSON, Python and — with dashes — on the
command line), its Python type, its allowed values or range, its default and unit, the catalog key of
its help text (``i18n/<lang>/options.json``), which commands take it, and whether it changes the model
states (the analytic cache key). Everything else is derived from :data:`FIELDS`:

* the argparse flags of ``estimate``, ``fit``, ``trace``, ``measure``, ``infer``, ``lora`` and the
  ``from-config`` overrides (:func:`add_arguments`, :func:`values_from_args`);
* the validation of :class:`cabe.training.TrainingSetup` and the fields :func:`cabe.api.build` accepts;
* the HTTP request models and the OpenAPI document (:func:`json_schema`, in :mod:`cabe.web`);
* the cache key of model states (:func:`state_fields`) and ``docs/options.md`` (:func:`markdown`).

Defaults live here; :func:`resolve_defaults` is the one place that combines fields (the ``precision``
shorthand sets ``dtype`` and ``autocast``). This module imports nothing heavy (the CLI builds its parser from
it on every start).

Commands (the ``commands`` of a field): the CLI commands ``estimate``, ``fit``, ``trace``, ``measure``,
``infer``, ``lora``, ``from-config`` (overrides of what the files say), and the HTTP endpoints
``api.estimate``, ``api.fit``, ``api.infer``, ``api.lora``.

``python -m cabe.schema --markdown`` prints the options table of ``docs/options.md``.

Over 600 lines on purpose (1,639 on 2026-12-07, session 42): this is the one table of every request field (issue 28
keeps each field declared once). The table alone is 861 lines (``_MODEL`` to ``FIELDS``, lines 212-1073: serving's
engines, generation and parallel fields joined it in session 41, TRL's trainers' and fp8's in session 42) and
:class:`Field` with its builders another 130, so the declarations by themselves are over 600 before anything reads
them; splitting the table across modules would scatter the one place a field is declared. The seam that remains is
the machinery after the table (what applies to a request and the defaults, ~360 lines; argparse and the markdown
table, ~175), which could move to a module that imports this one: it would leave this one at ~1,100 lines, still
over, so it stays here beside the table it reads.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cabe import optimizer, recipes
from cabe.errors import InvalidValueError
from cabe.i18n import t
from cabe.optimizer import ACCEPTED as OPTIMIZER_NAMES
from cabe.optimizer import GALORE_RANK, LOW_RANK_NAMES
from cabe.recipes import NAMES as RECIPES

# Upper bounds that catch typos (a batch of 10^9) without limiting real use.
MAX_BATCH = 1 << 20
MAX_SEQ = 1 << 24
#: the reference of a preference trainer (cabe.objectives.preference)
REF_MODELS = ("auto", "copy", "adapter-off")
#: DPOConfig's loss types (trl 1.16.0 dpo_config.py:87-91), then KTOConfig's (kto_config.py:198-203)
DPO_LOSS_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot", "aot_unpaired",
    "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
)  # fmt: skip
KTO_LOSS_TYPES = ("kto", "apo_zero_unpaired")
LOSS_TYPES = ("auto",) + DPO_LOSS_TYPES + KTO_LOSS_TYPES
MAX_RANK = 1 << 16
MAX_GPUS = 1 << 20
MAX_LAYERS = 1 << 12

#: the commands and endpoints a field can belong to
CLI_COMMANDS = ("estimate", "fit", "trace", "measure", "infer", "lora", "from-config")
API_COMMANDS = ("api.estimate", "api.fit", "api.infer", "api.lora")
COMMANDS = CLI_COMMANDS + API_COMMANDS

#: argparse groups (and sections of docs/options.md), in order
GROUPS = ("model", "setup", "gpus", "fit", "serving", "trace", "output")

_TRAINING = ("estimate", "fit", "trace", "measure", "api.estimate", "api.fit")
_ESTIMATE = ("estimate", "fit", "trace", "measure")  # the CLI commands that take every training field


@dataclass(frozen=True)
class Field:
    """One field of a request.

    Args:
        name: snake_case name on every interface (``lora_rank``; ``--lora-rank`` on the command line).
        type: the Python type of a valid value: ``int``, ``float``, ``str``, ``bool``, ``tuple`` (a list
            of strings; a comma string on the command line) or ``dict`` (a JSON object).
        group: where it sits in ``--help`` and in docs/options.md (one of :data:`GROUPS`).
        commands: the commands and endpoints that take it (:data:`COMMANDS`).
        default: the value when it is not given; ``None`` means "not given" is a state of its own
            (e.g. ``optimizer_impl``: what PyTorch picks). Depending defaults: :func:`resolve_defaults`.
        choices: the allowed values of a string field, or None.
        choices_from: ``"module:attribute"`` of a catalog that lives in the core (weight formats), read
            lazily by :meth:`allowed`.
        minimum, maximum: the range of a number (inclusive); ``exclusive_minimum`` makes ``minimum``
            excluded.
        unit: what a number counts (``tokens``, ``sequences``, ``GB``...), or None.
        states: it changes the model states (weights, gradients, optimizer state): part of their
            cache key.
        flags: its command-line spellings (the first is the canonical one); empty: not on the command
            line.
        aliases: older names ``cabe lora`` and ``/api/lora`` still accept (``rank``).
        required_for: commands where it must be given.
        cli_default: the command line fills in the default (so it is always sent).
        cli_typed: argparse converts and checks it (``type=``, ``choices=``); otherwise the core does,
            with typed errors.
        negatable: a flag with a ``--no-`` form.
        max_length: the longest string the HTTP API accepts.
        help_key: its help text in the catalogs (``option.<name>`` unless said).
        metavar: the placeholder in ``--help``.
        depends_on: the fields its default depends on (decided by :func:`resolve_defaults`).
        methods: the training methods it acts for (empty: every method); given with another method it
            is refused (:func:`inapplicable`), never dropped without a word.
        low_rank_only: read by the low-rank (GaLore) optimizers only; given with another optimizer it is
            refused (:func:`inapplicable`, ``galore_only``).
    """

    name: str
    type: type
    group: str
    commands: tuple[str, ...]
    default: Any = None
    choices: tuple[str, ...] | None = None
    choices_from: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    unit: str | None = None
    states: bool = False
    flags: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    required_for: tuple[str, ...] = ()
    cli_default: bool = False
    cli_typed: bool = False
    negatable: bool = False
    max_length: int | None = None
    help_key: str = ""
    metavar: str | None = None
    depends_on: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    low_rank_only: bool = False

    @property
    def key(self) -> str:
        """The catalog key of the help text."""
        return self.help_key or f"option.{self.name}"

    @property
    def dest(self) -> str:
        """The argparse attribute (the field's name)."""
        return self.name

    def allowed(self) -> tuple[str, ...] | None:
        """The allowed values: :attr:`choices`, or the catalog :attr:`choices_from` names."""
        if self.choices is not None:
            return self.choices
        if self.choices_from is None:
            return None
        module, _, attr = self.choices_from.partition(":")
        return tuple(getattr(importlib.import_module(module), attr))

    def json_schema(self) -> dict[str, Any]:
        """The field as a JSON Schema (OpenAPI 3.1) property: type, enum, range, default."""
        out: dict[str, Any] = dict(_JSON_TYPES[self.type])
        allowed = self.allowed()
        if allowed is not None and self.type is tuple:  # a list of names: each one of the choices
            out["items"] = {**out["items"], "enum": list(allowed)}
        elif allowed is not None:
            out["enum"] = list(allowed)
        if self.minimum is not None:
            out["exclusiveMinimum" if self.exclusive_minimum else "minimum"] = _json_number(self.minimum, self.type)
        if self.maximum is not None:
            out["maximum"] = _json_number(self.maximum, self.type)
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        if self.default is not None and self.default != () and not self.depends_on:  # see resolve_defaults
            out["default"] = list(self.default) if isinstance(self.default, tuple) else self.default
        return out


_JSON_TYPES: dict[type, dict[str, Any]] = {
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
    bool: {"type": "boolean"},
    tuple: {"type": "array", "items": {"type": "string"}, "minItems": 1},
    dict: {"type": "object"},
}


def _json_number(x: float, kind: type) -> int | float:
    return int(x) if kind is int or float(x).is_integer() else x


def _int(
    name: str, group: str, commands: tuple[str, ...], default: int | None, lo: int, hi: int | None, **kw: Any
) -> Field:
    return Field(name, int, group, commands, default, minimum=lo, maximum=hi, **kw)


def _choice(
    name: str, group: str, commands: tuple[str, ...], default: str | None, choices: tuple[str, ...], **kw: Any
) -> Field:
    return Field(name, str, group, commands, default, choices=choices, **kw)


def _flag(name: str) -> tuple[str, ...]:
    return ("--" + name.replace("_", "-"),)


# NOTE: the order of FIELDS is the order of ``known fields`` in error messages, of the checks of
# TrainingSetup (choices, then integers, per group) and of docs/options.md; keep new fields at the end
# of their group.
_MODEL: tuple[Field, ...] = (
    Field(
        "params",
        float,
        "model",
        _TRAINING,
        minimum=0,
        maximum=1e6,
        exclusive_minimum=True,
        unit="billion parameters",
        flags=_flag("params"),
    ),
    Field(
        "bytes_per_param",
        float,
        "model",
        _TRAINING,
        minimum=0,
        maximum=1024,
        exclusive_minimum=True,
        unit="B/parameter",
        flags=_flag("bytes_per_param"),
    ),
    Field(
        "activations_gb",
        float,
        "model",
        _TRAINING,
        minimum=0,
        maximum=1e6,
        unit="GB",
        flags=_flag("activations_gb"),
    ),
    Field(
        "model",
        str,
        "model",
        _TRAINING + ("infer", "lora", "from-config", "api.infer", "api.lora"),
        max_length=200,
        flags=("--model", "-m"),
    ),
    Field("config", dict, "model", ("api.estimate", "api.fit", "api.infer", "api.lora")),
    Field(
        "gpu",
        str,
        "model",
        # NOTE: not `trace` / `measure`: they report the step's memory, not a verdict on a card
        ("estimate", "fit", "api.estimate", "api.fit", "infer", "from-config", "api.infer"),
        max_length=100,
        flags=_flag("gpu"),
        required_for=("fit", "api.fit"),
    ),
)

_SETUP: tuple[Field, ...] = (
    _choice(
        "method",
        "setup",
        _TRAINING,
        "full",
        ("full", "lora", "qlora", "freeze", "prompt-tuning"),
        states=True,
        flags=_flag("method"),
    ),
    # Precision has two axes, as in transformers: the dtype the weights are loaded in
    # (``from_pretrained(dtype=...)``; transformers 5 defaults to "auto", the checkpoint's dtype) and
    # the Trainer's autocast (``bf16=True`` / ``fp16=True``). ``precision`` names common pairs.
    _choice(
        "dtype",
        "setup",
        _TRAINING + ("from-config",),
        "auto",
        ("auto", "fp32", "bf16", "fp16"),
        states=True,
        flags=_flag("dtype"),
    ),
    _choice(
        "autocast",
        "setup",
        _TRAINING + ("from-config",),
        "bf16",
        ("none", "bf16", "fp16"),
        states=True,
        flags=_flag("autocast"),
    ),
    _choice(
        "precision",
        "setup",
        _TRAINING,
        None,
        ("fp32", "fp16-amp", "bf16-amp", "bf16", "fp16", "bf16-mixed", "fp16-mixed"),
        states=True,
        flags=_flag("precision"),
    ),
    # fp8 training (issue 33): torchao's float8 linear recipes (Float8LinearConfig.from_recipe_name: tensorwise,
    # rowwise, rowwise_with_gw_hp) or Transformer Engine's te.Linear under DelayedScaling, Float8CurrentScaling or
    # MXFP8BlockScaling (modelled from source, not traced); what each keeps in fp8 and which cards run it: cabe.fp8
    _choice(
        "fp8",
        "setup",
        _TRAINING + ("from-config",),
        "none",
        ("none", "tensorwise", "rowwise", "rowwise-gw-hp", "te-delayed", "te-current", "te-mxfp8"),
        states=True,
        flags=_flag("fp8"),
    ),
    # NOTE: cabe's names, then the HF Trainer's ``optim`` names (transformers OptimizerNames): those map to an
    # entry (and the implementation they imply) in TrainingSetup, or are refused by name (optimizer_not_modelled)
    _choice("optimizer", "setup", _TRAINING, "adamw", OPTIMIZER_NAMES, states=True, flags=_flag("optimizer")),
    _choice(
        "optimizer_impl",
        "setup",
        _TRAINING,
        None,
        ("foreach", "fused", "for-loop"),
        states=True,
        flags=_flag("optimizer_impl"),
    ),
    _int("batch", "setup", _TRAINING + ("from-config",), 1, 1, MAX_BATCH, unit="sequences", flags=_flag("batch")),
    _int("seq", "setup", _TRAINING + ("from-config",), 512, 1, MAX_SEQ, unit="tokens", flags=_flag("seq")),
    _int(
        "grad_accum",
        "setup",
        _TRAINING + ("from-config",),
        1,
        1,
        MAX_BATCH,
        unit="steps",
        flags=_flag("grad_accum"),
    ),
    Field("checkpointing", bool, "setup", _TRAINING, False, flags=_flag("checkpointing")),
    _choice("attention", "setup", _TRAINING, "sdpa", ("eager", "sdpa", "flash"), flags=_flag("attention")),
    _int(
        "lora_rank",
        "setup",
        _TRAINING + ("lora", "api.lora"),
        8,
        1,
        MAX_RANK,
        states=True,
        methods=("lora", "qlora"),
        flags=_flag("lora_rank"),
        aliases=("rank",),
    ),
    Field(
        "lora_alpha",
        float,
        "setup",
        _TRAINING,
        16.0,
        minimum=0,
        maximum=1e15,
        exclusive_minimum=True,
        methods=("lora", "qlora"),
        flags=_flag("lora_alpha"),
    ),
    # NOTE: () means PEFT's default targets for the model type
    # (peft.utils.constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
    Field(
        "lora_targets",
        tuple,
        "setup",
        _TRAINING + ("lora", "api.lora"),
        (),
        states=True,
        methods=("lora", "qlora"),
        flags=_flag("lora_targets"),
        aliases=("targets",),
    ),
    _choice("quant", "setup", _TRAINING, "nf4", ("nf4", "fp4"), states=True, methods=("qlora",), flags=_flag("quant")),
    Field(
        "double_quant",
        bool,
        "setup",
        _TRAINING,
        True,
        states=True,
        methods=("qlora",),
        flags=_flag("double_quant"),
        negatable=True,
    ),
    _choice(
        "compute_dtype",
        "setup",
        _TRAINING,
        "bf16",
        ("bf16", "fp16", "fp32"),
        states=True,
        methods=("qlora",),
        flags=_flag("compute_dtype"),
    ),
    _int(
        "trainable_layers",
        "setup",
        _TRAINING,
        1,
        0,
        MAX_LAYERS,
        unit="layers",
        states=True,
        methods=("freeze",),
        flags=_flag("trainable_layers"),
    ),
    _int(
        "prompt_tokens",
        "setup",
        _TRAINING,
        20,
        1,
        MAX_SEQ,
        unit="tokens",
        states=True,
        methods=("prompt-tuning",),
        flags=_flag("prompt_tokens"),
    ),
    # ---- trainers' recipes and loss kernels (issue 11) ----
    # NOTE: a recipe only sets defaults (cabe/data/recipes/<name>.json, applied by resolve_defaults);
    # every field it sets can be given explicitly. ``loss`` None: the recipe's, else transformers' own (hf).
    _choice("recipe", "setup", _TRAINING + ("from-config",), None, RECIPES, flags=_flag("recipe")),
    # ---- GRPO: TRL's GRPOTrainer (issue 33), its GRPOConfig names (trl 1.16.0 trainer/grpo_config.py) ----
    # ``batch`` is per_device_train_batch_size and counts completions; the generation batch (completions generated
    # at once) is generation_batch_size, else batch x gpus x steps_per_generation (steps_per_generation defaults to
    # grad_accum: grpo_config.py:1097-1112); the phases are cabe.objectives.grpo. Act with --objective grpo only.
    _int(
        "num_generations",
        "setup",
        _TRAINING + ("from-config",),
        8,
        2,
        MAX_BATCH,
        unit="completions",
        flags=_flag("num_generations"),
    ),  # grpo_config.py:480 (8); below 2 TRL refuses (:1132)
    _int(
        "max_completion_length",
        "setup",
        _TRAINING + ("from-config",),
        512,
        1,
        MAX_SEQ,
        unit="tokens",
        flags=_flag("max_completion_length"),
    ),  # grpo_config.py:494 (512)
    _int(
        "generation_batch_size",
        "setup",
        _TRAINING + ("from-config",),
        None,
        1,
        MAX_BATCH,
        unit="completions",
        flags=_flag("generation_batch_size"),
    ),
    _int(
        "steps_per_generation",
        "setup",
        _TRAINING + ("from-config",),
        None,
        1,
        MAX_BATCH,
        unit="steps",
        flags=_flag("steps_per_generation"),
    ),
    # vLLM generation (grpo_config.py:587-671): colocate runs the engine in the training process on the same card,
    # its pool vllm_gpu_memory_utilization x the card's memory (needs --gpu); server runs it on another GPU
    Field("use_vllm", bool, "setup", _TRAINING + ("from-config",), False, flags=_flag("use_vllm"), negatable=True),
    _choice(
        "vllm_mode", "setup", _TRAINING + ("from-config",), "colocate", ("colocate", "server"), flags=_flag("vllm_mode")
    ),
    Field(
        "vllm_gpu_memory_utilization",
        float,
        "setup",
        _TRAINING + ("from-config",),
        0.3,
        minimum=0,
        maximum=1,
        exclusive_minimum=True,
        flags=_flag("vllm_gpu_memory_utilization"),
    ),
    Field(
        "vllm_enable_sleep_mode",
        bool,
        "setup",
        _TRAINING + ("from-config",),
        False,
        flags=_flag("vllm_enable_sleep_mode"),
        negatable=True,
    ),
    # the KL coefficient (grpo_config.py:681, default 0.0): 0 loads no reference model (grpo_trainer.py:984-1003)
    Field("beta", float, "setup", _TRAINING + ("from-config",), 0.0, minimum=0, maximum=1e6, flags=_flag("beta")),
    _choice(
        "loss",
        "setup",
        _TRAINING + ("from-config",),
        None,
        ("hf", "chunked", "liger", "cce", "litgpt"),
        flags=_flag("loss"),
        depends_on=("recipe",),
    ),
    # what the step optimises: supervised fine-tuning (``sft``, the Trainer / TRL's SFTTrainer), or a preference /
    # reinforcement objective with TRL's trainer of that name (DPOTrainer, ORPOTrainer, KTOTrainer, GRPOTrainer):
    # each one's phases (reference forward, generation, policy step) are :mod:`cabe.objectives`
    _choice(
        "objective",
        "setup",
        _TRAINING + ("from-config",),
        "sft",
        ("sft", "dpo", "orpo", "kto", "grpo"),
        flags=_flag("objective"),
    ),
    # ---- TRL's preference trainers (DPOTrainer, KTOTrainer: trl 1.16.0; ORPOTrainer: trl.experimental.orpo) ----
    # (cabe.objectives.preference walks their phases; given with another objective they are refused: objective_only)
    # the reference: a separate frozen copy (DPOConfig has no flag: ``ref_model`` given, or made by the trainer for a
    # full fine-tune, dpo_trainer.py:396-417), the policy's PEFT base with its adapters disabled (TRL's own with a
    # peft_config, dpo_trainer.py:1320-1331); auto: the adapters off for LoRA / QLoRA, else a copy
    _choice("ref_model", "setup", _TRAINING + ("from-config",), "auto", REF_MODELS, flags=_flag("ref_model")),
    # DPOConfig / KTOConfig ``precompute_ref_log_probs`` (dpo_config.py:74-77): the reference's log-probabilities
    # computed once before training, no reference during the step
    Field(
        "precompute_ref_log_probs",
        bool,
        "setup",
        _TRAINING + ("from-config",),
        False,
        flags=_flag("precompute_ref_log_probs"),
    ),
    # the prompt's tokens, for TRL's trainers (TrainingSetup.resolved_prompt_length: None is the objective's default):
    # DPO / ORPO / KTO: of each row's ``seq`` tokens (TRL's max_length: the collator truncates prompt + completion to
    # it, dpo_trainer.py:159-170), how many are prompt: TRL's fused LM head scores only the completion's positions
    # (trl/trainer/utils.py:1629-1645); default 0: every position. GRPO: TRL 1.16's GRPOConfig has no
    # max_prompt_length (prompts are not truncated, left-padded to the longest of the batch:
    # grpo_trainer.py:1815-1826): the longest prompt of a generation batch; default 512
    _int(
        "prompt_length",
        "setup",
        _TRAINING + ("from-config",),
        None,
        0,
        MAX_SEQ,
        unit="tokens",
        flags=_flag("prompt_length"),
    ),
    # DPOConfig.loss_type (dpo_config.py:232) / KTOConfig.loss_type (kto_config.py:198): KTO's ``kto`` runs the KL
    # batch, ``apo_zero_unpaired`` does not (kto_trainer.py:815); DPO's are per-sequence scalars beside the log-probs
    _choice("loss_type", "setup", _TRAINING + ("from-config",), "auto", LOSS_TYPES, flags=_flag("loss_type")),
    # DPOConfig.use_weighting (WPO): the fused head also returns log(sum p^2) per position (dpo_trainer.py:957-959)
    Field("use_weighting", bool, "setup", _TRAINING + ("from-config",), False, flags=_flag("use_weighting")),
    # torchtune's CEWithChunkedOutputLoss(num_output_chunks=8) (modules/loss/ce_chunked_output_loss.py)
    _int("loss_chunks", "setup", _TRAINING + ("from-config",), 8, 1, MAX_SEQ, flags=_flag("loss_chunks")),
    # GaLore's rank (the Trainer's optim_args "rank", default 128: trainer_optimizer.py:370) and targets (the
    # Trainer's optim_target_modules, which it requires; the default here is the Trainer docs' ["attn", "mlp"])
    _int(
        "galore_rank",
        "setup",
        _TRAINING,
        GALORE_RANK,
        1,
        MAX_RANK,
        states=True,
        flags=_flag("galore_rank"),
        low_rank_only=True,
    ),
    Field(
        "galore_targets",
        tuple,
        "setup",
        _TRAINING,
        ("attn", "mlp"),
        states=True,
        flags=_flag("galore_targets"),
        low_rank_only=True,
    ),
    # ---- LoRA variants (issue 11): PEFT LoraConfig(use_dora=..., lora_dropout=...) ----
    Field("dora", bool, "setup", _TRAINING, False, states=True, methods=("lora", "qlora"), flags=_flag("dora")),
    # NOTE: [0, 1): nn.Dropout(p=1) would zero lora_A's input; training.validate refuses 1 (a typed error)
    Field(
        "lora_dropout",
        float,
        "setup",
        _TRAINING,
        0.0,
        minimum=0,
        maximum=1,
        methods=("lora", "qlora"),
        flags=_flag("lora_dropout"),
    ),
    # ---- memory savers (issue 11) ----
    # selective checkpointing: with ``checkpointing``, only every k-th decoder layer is checkpointed
    # (transformers 5.24 modeling_utils.py:3246, ``layer_index % every_n_layers == 0``; torchtune's
    # ``ac_mode: selective`` / ``ac_option: k``, torchtune/training/activations.py:44-47)
    _int(
        "checkpoint_every",
        "setup",
        _TRAINING + ("from-config",),
        1,
        1,
        MAX_LAYERS,
        unit="layers",
        flags=_flag("checkpoint_every"),
    ),
    # activation offloading: saved activations in pinned host memory, back for backward
    # (transformers 5.24 modeling_utils.py:3161-3167, ``save_on_cpu(pin_memory=True)`` around each checkpoint;
    # torchtune's OffloadActivations, torchtune/training/_activation_offloading.py)
    Field(
        "offload_activations",
        bool,
        "setup",
        _TRAINING + ("from-config",),
        False,
        flags=_flag("offload_activations"),
        negatable=True,  # a recipe (unsloth) turns it on: --no-offload-activations turns it off
    ),
    # how a batch is laid out: padded rows (``none``: each row ``seq`` tokens, the longest of the batch under
    # dynamic padding), ``packed`` rows of exactly ``seq`` tokens holding several documents, or
    # ``padding-free`` (one row of batch × seq tokens): TRL ``packing`` / ``padding_free``, axolotl
    # ``sample_packing``; documents told apart by position_ids (transformers 5.24 masking_utils.py:862-870)
    _choice(
        "packing",
        "setup",
        _TRAINING + ("from-config",),
        "none",
        ("none", "packed", "padding-free"),
        flags=_flag("packing"),
    ),
    # images in each sequence, for a model whose vision tower cabe models (Qwen2.5-VL): each image's tokens
    # replace as many of the sequence's ``seq`` tokens, as the processor writes them into the text
    # (cabe.vision); 0: text-only batches, the tower never runs
    # (states: images make full fine-tuning train the tower, and LoRA train the adapters PEFT puts on it)
    _int(
        "images",
        "setup",
        _TRAINING + ("from-config",),
        0,
        0,
        1 << 12,
        unit="images",
        states=True,
        flags=_flag("images"),
    ),
    # the images' size in pixels, before the processor's resize (Qwen2VLImageProcessor's smart_resize:
    # cabe.vision.images.resized)
    Field(
        "image_size",
        str,
        "setup",
        _TRAINING + ("from-config",),
        "448x448",
        unit="pixels",
        max_length=40,
        flags=_flag("image_size"),
        metavar="HxW",
    ),
    # ---- what a trainer does to a 4-bit model before training (issue 11) ----
    # PEFT's prepare_model_for_kbit_training (peft 0.21.2 utils/other.py:193-209) freezes the model and casts
    # every 16-bit parameter that is not 4-bit to fp32 (norms, embeddings, lm_head, unquantized experts); off:
    # they stay in the compute dtype, as unsloth (unsloth_zoo training_utils.py:300-410, prepare_model_for_training)
    # and LLaMA-Factory (model_utils/checkpointing.py:163-204, upcast_layernorm False) leave them
    Field(
        "kbit_prep",
        bool,
        "setup",
        _TRAINING + ("from-config",),
        True,
        states=True,
        methods=("qlora",),
        flags=_flag("kbit_prep"),
        negatable=True,
    ),
    # PEFT's modules_to_save (LoraConfig(modules_to_save=[...]); unsloth's embed_tokens among target_modules,
    # LLaMA-Factory's additional_target): whole modules trained beside the adapters, a trainable copy each
    # (cabe.method.saved_modules: the token embedding and the lm_head)
    Field(
        "modules_to_save",
        tuple,
        "setup",
        _TRAINING + ("from-config",),
        (),
        states=True,
        methods=("lora", "qlora"),
        flags=_flag("modules_to_save"),
    ),
    # freeze with the trained layers cast to fp32 (LLaMA-Factory's init_adapter, model/adapter.py:129-134 and
    # 337-349: cast_trainable_params_to_fp32 unless pure_bf16), the frozen ones left as loaded, under autocast
    Field(
        "trainable_fp32",
        bool,
        "setup",
        _TRAINING + ("from-config",),
        False,
        states=True,
        methods=("freeze",),
        flags=_flag("trainable_fp32"),
        negatable=True,
    ),
    # the transformers line the run uses (cabe.transformers_line): "4", "5" or a version ("4.51.3"); not given,
    # the installed one's, else 5. 4.x builds MoE experts as nn.Linear modules, loads fp32 when no dtype is given,
    # checkpoints reentrantly; each difference is cited there
    Field(
        "transformers",
        str,
        "setup",
        _TRAINING + ("from-config",),
        None,
        states=True,
        max_length=40,
        flags=_flag("transformers"),
        metavar="4|5|VERSION",
    ),
    # the optimizer steps each parameter inside backward, in its post-accumulate-grad hook, and frees its gradient
    # there (torchtune's optimizer_in_bwd: torchtune/training/memory.py:58-240, commit bd2a0fc); one GPU, no
    # gradient accumulation, as torchtune and the Trainer's *_layerwise optimizers require
    # the LoRA adapters' dtype: PEFT's default fp32 (get_peft_model(autocast_adapter_dtype=True): peft 0.21.2
    # peft_model.py, _cast_adapter_dtype) or the base weights' dtype (autocast_adapter_dtype=False: the adapters stay
    # as LoraLayer._move_adapter_to_device_of_base_layer made them; torchtune's and LitGPT's bf16-true adapters)
    _choice(
        "adapter_dtype",
        "setup",
        _TRAINING + ("from-config",),
        "fp32",
        ("fp32", "model"),
        states=True,
        methods=("lora",),
        flags=_flag("adapter_dtype"),
    ),
    Field(
        "optimizer_in_backward",
        bool,
        "setup",
        _TRAINING + ("from-config",),
        False,
        states=True,
        flags=_flag("optimizer_in_backward"),
        negatable=True,
    ),
)

_GPUS: tuple[Field, ...] = (
    # infer: every GPU of the deployment, tp × pp per replica × data-parallel replicas (cabe.serving_parallel)
    _int(
        "gpus",
        "gpus",
        _TRAINING + ("from-config", "infer", "api.infer"),
        1,
        1,
        MAX_GPUS,
        unit="GPUs",
        flags=_flag("gpus"),
    ),
    _choice(
        "shard",
        "gpus",
        _TRAINING,
        "none",
        ("none", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-hybrid"),
        flags=_flag("shard"),
    ),
    _choice("offload", "gpus", _TRAINING, "none", ("none", "optimizer", "parameters", "both"), flags=_flag("offload")),
    # FSDP MixedPrecision / FSDP2 MixedPrecisionPolicy param_dtype, DeepSpeed bf16 / fp16: cabe.precision
    _choice(
        "param_dtype",
        "gpus",
        _TRAINING + ("from-config",),
        "none",
        ("none", "bf16", "fp16"),
        states=True,
        flags=_flag("param_dtype"),
    ),
    # infer: vLLM's / SGLang's tensor- and pipeline-parallel sizes and --enable-expert-parallel's ep = tp × dp
    _int("tp", "gpus", _TRAINING + ("infer", "api.infer"), 1, 1, MAX_GPUS, flags=_flag("tp")),
    _int("pp", "gpus", _TRAINING + ("infer", "api.infer"), 1, 1, MAX_GPUS, flags=_flag("pp")),
    _int("ep", "gpus", _TRAINING + ("infer", "api.infer"), 1, 1, MAX_GPUS, flags=_flag("ep")),
    _int("gpus_per_node", "gpus", _TRAINING, 8, 1, MAX_GPUS, unit="GPUs", flags=_flag("gpus_per_node")),
    # tensor parallelism's loss: the logits kept sharded over the vocabulary (Megatron's vocab-parallel cross-entropy,
    # torchtitan's and torch.distributed.tensor.parallel's ``loss_parallel``) or gathered whole on every GPU
    # (transformers' ``DistributedConfig(tp_size=K)``: the lm_head's ``colwise_gather_output`` style)
    Field("loss_parallel", bool, "gpus", _TRAINING, True, flags=_flag("loss_parallel"), negatable=True),
    # Megatron-style sequence parallelism beside TP: the norms' and the residual's tensors split over the sequence
    # (Korthikanti et al. 2022; torch.distributed.tensor.parallel ``SequenceParallel``)
    Field("sequence_parallel", bool, "gpus", _TRAINING, False, flags=_flag("sequence_parallel")),
    # accelerate's FSDP ``cpu_ram_efficient_loading`` (accelerate 1.16 utils/fsdp_utils.py:fsdp2_prepare_model): rank
    # 0's weights broadcast one tensor at a time into shards made on meta, instead of each unit moved whole and sharded;
    # true by default in ``accelerate launch`` (commands/launch.py) and ``accelerate config`` (commands/config/
    # cluster.py), false in TrainingArguments' fsdp_config: cabe.parallel.loading. Read with FSDP only (fsdp_only)
    Field(
        "cpu_ram_efficient_loading",
        bool,
        "gpus",
        _TRAINING + ("from-config",),
        True,
        flags=_flag("cpu_ram_efficient_loading"),
        negatable=True,
    ),
    # FSDP2's ``fully_shard(..., reshard_after_forward=...)`` on every decoder-layer unit (accelerate's, torchtune's,
    # TrainingArguments' ``fsdp_reshard_after_forward``; FSDP1's SHARD_GRAD_OP): false keeps each unit's all-gathered
    # parameters from its forward to its post-backward (torch 2.13 _fsdp_param_group.py ``reshard``); the root never
    # reshards (``None`` there: _fsdp_state.py ``_lazy_init``): cabe.parallel.fsdp. Read with FSDP only (fsdp_only)
    Field(
        "reshard_after_forward",
        bool,
        "gpus",
        _TRAINING + ("from-config",),
        True,
        states=True,
        flags=_flag("reshard_after_forward"),
        negatable=True,
    ),
    # context parallelism: each GPU of a cp group holds seq / cp tokens' activations (cabe.parallel.context); the
    # world is dp × cp × tp × pp (accelerate 1.16 parallelism_config.py ``total_size``, torchtitan's mesh)
    _int("cp", "gpus", _TRAINING, 1, 1, MAX_GPUS, flags=_flag("cp")),
    # how attention sees the other GPUs' tokens: torch's ring attention (torch 2.13 distributed/tensor/experimental/
    # _context_parallel/_attention.py, ``set_rotate_method``: the key / value shards all-gathered once, or passed
    # round the ring by all-to-all; accelerate's ``cp_comm_strategy``) or DeepSpeed-Ulysses (deepspeed 0.19.8
    # runtime/sequence_parallel/ulysses_sp.py: an all-to-all from sequence shards to head shards; accelerate's
    # ``sp_backend="deepspeed"``). Read with cp > 1 only (cp_only)
    _choice(
        "cp_impl",
        "gpus",
        _TRAINING,
        "allgather",
        ("allgather", "alltoall", "ulysses"),
        flags=_flag("cp_impl"),
    ),
    # FSDP2's units (cabe.parallel.fsdp; traced by cabe.trace.fsdp_wrap): ``accelerate`` is accelerate >= 1.14's
    # ``fsdp2_prepare_model`` (1.16 utils/fsdp_utils.py:850-904), run by the Trainer and ``accelerate launch``: each
    # decoder layer, the input embedding, [final norm, lm_head] kept gathered from its forward to its backward, the
    # root; ``layers`` is each decoder layer and the root holding embeddings, final norm and lm_head (accelerate
    # <= 1.13, FSDP1's transformer_based_wrap). Read with FSDP only (fsdp_only)
    Field(
        "fsdp_wrap",
        str,
        "gpus",
        _TRAINING + ("from-config",),
        "accelerate",
        choices=("accelerate", "layers"),
        states=True,
        flags=_flag("fsdp_wrap"),
    ),
)

_FIT: tuple[Field, ...] = (
    Field(
        "solve",
        tuple,
        "fit",
        ("fit", "api.fit"),
        ("batch", "seq", "gpus", "changes"),
        choices=("batch", "seq", "gpus", "changes"),
        flags=_flag("solve"),
    ),
    Field(
        "mfu", float, "fit", ("fit", "api.fit"), 0.4, minimum=0, maximum=1, exclusive_minimum=True, flags=_flag("mfu")
    ),
    Field(
        "tokens",
        float,
        "fit",
        ("fit", "api.fit"),
        None,
        minimum=0,
        maximum=1e16,
        exclusive_minimum=True,
        unit="tokens",
        flags=_flag("tokens"),
    ),
    # the run's GPU-hours (for the setup that fits) times this: its cost (cabe.plan_cost.run_cost)
    Field(
        "price_per_gpu_hour",
        float,
        "fit",
        ("fit", "api.fit"),
        None,
        minimum=0,
        maximum=1e9,
        unit="per GPU-hour",
        flags=_flag("price_per_gpu_hour"),
    ),
)

_INFER = ("infer", "api.infer")
_SERVING: tuple[Field, ...] = (
    Field(
        "weights",
        str,
        "serving",
        _INFER,
        "auto",
        choices_from="cabe.weights:FORMATS",
        flags=_flag("weights"),
        cli_default=True,
    ),
    Field(
        "kv_dtype",
        str,
        "serving",
        _INFER,
        "auto",
        choices_from="cabe.kv_cache:KV_CHOICES",
        flags=_flag("kv_dtype"),
        cli_default=True,
    ),
    # NOTE: the core caps the default context at the model's max_position_embeddings
    _int("context", "serving", _INFER, 4096, 1, MAX_SEQ, unit="tokens", flags=_flag("context")),
    _int(
        "batch",
        "serving",
        _INFER,
        1,
        1,
        MAX_SEQ,
        unit="sequences",
        flags=_flag("batch"),
        help_key="option.serving.batch",
    ),
    _choice(
        "mode",
        "serving",
        _INFER,
        "generate",
        ("generate", "prefill"),
        flags=_flag("mode"),
        cli_default=True,
        help_key="option.serving.mode",
    ),
    _int("prefill_chunk", "serving", _INFER, None, 1, MAX_SEQ, unit="tokens", flags=_flag("prefill_chunk")),
    _int("group_size", "serving", _INFER, 128, 1, MAX_SEQ, unit="weights", flags=_flag("group_size")),
    Field(
        "gpu_memory_utilization",
        float,
        "serving",
        _INFER,
        0.9,
        minimum=0,
        maximum=1,
        exclusive_minimum=True,
        flags=_flag("gpu_memory_utilization"),
    ),
    # images in each request's prompt (cabe.vision): their tokens join the context and the KV cache, the
    # vision tower runs at prefill
    _int(
        "images",
        "serving",
        _INFER,
        0,
        0,
        1 << 12,
        unit="images",
        flags=_flag("images"),
        help_key="option.serving.images",
    ),
    Field(
        "image_size",
        str,
        "serving",
        _INFER,
        "448x448",
        unit="pixels",
        max_length=40,
        flags=_flag("image_size"),
        metavar="HxW",
    ),
    # the serving engine whose accounting answers "how many tokens / sequences fit" (cabe.engines), and its knobs
    Field("engine", str, "serving", _INFER, "hf", choices_from="cabe.engines:ENGINES", flags=_flag("engine")),
    _int(
        "max_num_batched_tokens",
        "serving",
        _INFER,
        None,
        1,
        MAX_SEQ,
        unit="tokens",
        flags=_flag("max_num_batched_tokens"),
    ),
    _int("max_num_seqs", "serving", _INFER, None, 1, MAX_SEQ, unit="sequences", flags=_flag("max_num_seqs")),
    _int("block_size", "serving", _INFER, 16, 1, 1 << 16, unit="tokens", flags=_flag("block_size")),
    Field(
        "mem_fraction_static",
        float,
        "serving",
        _INFER,
        None,
        minimum=0,
        maximum=1,
        exclusive_minimum=True,
        flags=_flag("mem_fraction_static"),
    ),
    _int("n_batch", "serving", _INFER, 2048, 1, MAX_SEQ, unit="tokens", flags=_flag("n_batch")),
    _int("n_ubatch", "serving", _INFER, 512, 1, MAX_SEQ, unit="tokens", flags=_flag("n_ubatch")),
    Field(
        "cache_type_k",
        str,
        "serving",
        _INFER,
        "f16",
        choices_from="cabe.engines.llamacpp:KV_TYPES",
        flags=(*_flag("cache_type_k"), "-ctk"),
    ),
    Field(
        "cache_type_v",
        str,
        "serving",
        _INFER,
        "f16",
        choices_from="cabe.engines.llamacpp:KV_TYPES",
        flags=(*_flag("cache_type_v"), "-ctv"),
    ),
    _int(
        "n_gpu_layers",
        "serving",
        _INFER,
        None,
        0,
        MAX_LAYERS + 1,
        unit="layers",
        flags=(*_flag("n_gpu_layers"), "-ngl"),
    ),
    # decoder layers per pipeline stage (vLLM's VLLM_PP_LAYER_PARTITION, SGLang's SGLANG_PP_LAYER_PARTITION);
    # not given, get_pp_indices' split (cabe.serving_parallel.pp_partition)
    Field("pp_partition", str, "serving", _INFER, None, max_length=400, flags=_flag("pp_partition"), metavar="N,N,..."),
    # tokens generate makes within the context (prompt = context - new_tokens); not given: cabe.generation's
    # resolve_new_tokens (min(256, context // 2)), said in the answer
    _int("new_tokens", "serving", _INFER, None, 0, MAX_SEQ, unit="tokens", flags=_flag("new_tokens")),
    # transformers' cache_implementation: DynamicCache (torch.cat per step) or StaticCache (preallocated)
    _choice("cache", "serving", _INFER, "dynamic", ("dynamic", "static"), flags=_flag("cache"), cli_default=True),
    # run transformers' generate on fake CUDA tensors beside the estimate (cabe.trace.generate)
    Field("trace", bool, "serving", ("infer",), False, flags=_flag("trace"), cli_default=True),
)

_TRACE: tuple[Field, ...] = (
    _int(
        "steps", "trace", ("trace",), 2, 2, None, unit="steps", flags=_flag("steps"), cli_default=True, cli_typed=True
    ),
    _choice(
        "mode",
        "trace",
        ("trace",),
        "auto",
        ("auto", "fake", "meta"),
        flags=_flag("mode"),
        cli_default=True,
        cli_typed=True,
        help_key="option.trace.mode",
    ),
    Field("timeline", str, "trace", ("trace",), flags=_flag("timeline"), metavar="FILE.json"),
    Field("plot", str, "trace", ("trace",), flags=_flag("plot"), metavar="FILE.svg"),
    Field(
        "expandable_segments", bool, "trace", ("trace",), False, flags=_flag("expandable_segments"), cli_default=True
    ),
    Field("inventory", bool, "trace", ("trace",), False, flags=_flag("inventory"), cli_default=True),
)

_ALL_INTERFACES = tuple(c for c in COMMANDS if c != "api.lora")
_OUTPUT: tuple[Field, ...] = (
    _choice("lang", "output", COMMANDS, None, ("en", "es"), flags=_flag("lang")),
    _choice("units", "output", _ALL_INTERFACES, "GB", ("GB", "GiB"), flags=_flag("units"), cli_default=True),
    # each memory knob against the request without it (cabe.knob_effects): one more estimate per knob, so only when
    # asked; the command line's ``--explain`` (which prints the worked steps too) asks for it there
    Field("explain", bool, "output", ("api.estimate",), False),
)

#: every field, once
FIELDS: tuple[Field, ...] = _MODEL + _SETUP + _GPUS + _FIT + _SERVING + _TRACE + _OUTPUT

#: the fields of :class:`cabe.training.TrainingSetup`, in its order
SETUP_FIELDS: tuple[Field, ...] = _SETUP + _GPUS


def fields_for(command: str, *, output: bool = True) -> tuple[Field, ...]:
    """The fields a command or endpoint takes, in :data:`FIELDS` order; ``output=False`` leaves out
    ``lang`` and ``units`` (how to show the answer, not what to compute)."""
    if command not in COMMANDS:
        raise KeyError(command)
    return tuple(f for f in FIELDS if command in f.commands and (output or f.group != "output"))


def field(name: str, command: str | None = None) -> Field:
    """The field called ``name`` (for ``command`` when two commands mean different things by it:
    ``batch`` and ``mode`` of ``infer``). Without a command: the training field."""
    for f in FIELDS:
        if f.name == name and (command is None or command in f.commands):
            return f
    raise KeyError(name)


def names(command: str, *, output: bool = False) -> tuple[str, ...]:
    """The field names a command or endpoint takes (without ``lang`` / ``units`` unless asked)."""
    return tuple(f.name for f in fields_for(command, output=output))


#: the commands that still accept the older names of fields (:attr:`Field.aliases`)
ALIAS_COMMANDS = ("lora", "api.lora")


def aliases(command: str) -> dict[str, str]:
    """``{older name: field name}`` of a command (empty unless it is one of :data:`ALIAS_COMMANDS`)."""
    if command not in ALIAS_COMMANDS:
        return {}
    return {a: f.name for f in fields_for(command) for a in f.aliases}


def accepted(command: str) -> tuple[str, ...]:
    """Every key a request to ``command`` may carry: its fields (``lang`` / ``units`` included), then
    the older names it still accepts."""
    return names(command, output=True) + tuple(aliases(command))


def json_schema(command: str) -> dict[str, Any]:
    """The request of an endpoint (``api.*``) as a JSON Schema object: one property per field
    (:meth:`Field.json_schema`), the older names as deprecated properties, the fields it requires,
    and no other key (``additionalProperties: false``)."""
    props = {f.name: f.json_schema() for f in fields_for(command)}
    for alias, name in aliases(command).items():
        props[alias] = {**props[name], "deprecated": True}
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    required = [f.name for f in fields_for(command) if command in f.required_for]
    if required:
        out["required"] = required
    return out


#: the fields of the simple and lesson modes (a parameter count, no model): with a model they act not
MODEL_FREE = ("bytes_per_param", "activations_gb")
#: What the lesson's formula (``--params`` without ``--bytes-per-param``, ``analytic.estimate_lesson``) reads
#: of the setup; the simple mode (``--bytes-per-param``) reads none of it.
LESSON_FIELDS = ("method", "precision", "dtype", "autocast", "optimizer")


def _sent(v: Any) -> bool:
    return v is not None and v != "" and v != [] and v != ()


def _is_default(f: Field, v: Any) -> bool:
    """``v`` is the field's default (``"16"`` and ``16.0`` alike; 0 GB of activations): a whole form
    sent as is (the page, a script) carries every default, and a default changes nothing."""
    default = 0.0 if f.name == "activations_gb" else f.default
    if f.type in (int, float) and not isinstance(v, bool):
        try:
            return default is not None and float(str(v).replace(",", ".")) == float(default)
        except (TypeError, ValueError, OverflowError):
            return False
    if f.type is tuple and isinstance(v, (str, list, tuple)):
        given = [t.strip() for t in v.split(",")] if isinstance(v, str) else list(v)
        return tuple(t for t in given if t) == tuple(f.default or ())
    return bool(v == default)


def applies(name: str, values: Mapping[str, Any]) -> bool:
    """Does field ``name`` act in the request ``values``? (A method's own fields act with that method
    only; GaLore's with a GaLore optimizer only; the simple mode's fields without a model only.)"""
    f = field(name)
    method = values.get("method") if _sent(values.get("method")) else field("method").default
    if f.methods and method not in f.methods:
        return False
    if f.low_rank_only and not _low_rank(values):
        return False
    return not (name in MODEL_FREE and (_sent(values.get("model")) or _sent(values.get("config"))))


def _optimizer_of(values: Mapping[str, Any]) -> Any:
    """The optimizer a request runs: the one given, else its recipe's, else the default."""
    if _sent(values.get("optimizer")):
        return values["optimizer"]
    recipe = values.get("recipe")
    if isinstance(recipe, str) and recipe in RECIPES:
        return recipes.load(recipe)["sets"].get("optimizer", field("optimizer").default)
    return field("optimizer").default


def _low_rank(values: Mapping[str, Any]) -> bool:
    """The request's optimizer is a GaLore one (an unknown name counts as one: TrainingSetup refuses it
    with its own error)."""
    name = _optimizer_of(values)
    return not isinstance(name, str) or name in LOW_RANK_NAMES or name not in OPTIMIZER_NAMES


def inapplicable(values: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """The fields given in ``values`` with a value other than their default that would not act, each as
    ``(field, error code, params)``:
    ``not_for_method`` (``--lora-rank`` with ``--method full``), ``galore_only`` (``--galore-rank`` with
    ``--optimizer adamw``), ``needs_params`` (``--activations-gb``
    with a model), ``method_needs_model`` (``--method qlora`` with only a parameter count: the lesson
    and simple modes model full fine-tuning), ``needs_model`` (``--batch 8`` with only a parameter count:
    neither formula reads it)."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    method = values.get("method") if _sent(values.get("method")) else field("method").default
    for f in SETUP_FIELDS + tuple(field(n) for n in MODEL_FREE):
        v = values.get(f.name)
        if not _sent(v) or _is_default(f, v) or applies(f.name, values):
            continue
        if f.name in MODEL_FREE:
            out.append((f.name, "needs_params", {}))
        elif f.low_rank_only:
            names = sorted(n for n in LOW_RANK_NAMES if n in OPTIMIZER_NAMES and "_" not in n)
            out.append((f.name, "galore_only", {"optimizer": _optimizer_of(values), "optimizers": ", ".join(names)}))
        else:
            out.append((f.name, "not_for_method", {"method": method, "methods": ", ".join(f.methods)}))
    out += _companions(values)
    has_model = _sent(values.get("model")) or _sent(values.get("config"))
    if not has_model and _sent(values.get("params")):
        if method != "full":
            out.append(("method", "method_needs_model", {"value": method}))
        out += _model_only(values, [name for name, _, _ in out])
    return out


def _loss_of(values: Mapping[str, Any]) -> Any:
    """The loss kernel a request runs: the one given, else its recipe's, else transformers' own (hf)."""
    if _sent(values.get("loss")):
        return values["loss"]
    recipe = values.get("recipe")
    if isinstance(recipe, str) and recipe in RECIPES:
        return recipes.load(recipe)["sets"].get("loss", "hf")
    return "hf"


def _companions(values: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Fields that act only beside another field's value, given without it: ``loss_chunks`` with a loss that does
    not chunk (``chunked_only``: only torchtune's chunked loss reads it), ``optimizer_impl`` with an optimizer that
    has no foreach / fused / for-loop variants to tell apart (``impl_not_read``: bitsandbytes', torchao's, Lion's
    ... one kernel each). Unknown names are left to :class:`~cabe.training.TrainingSetup`'s own errors."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    chunks = values.get("loss_chunks")
    if _sent(chunks) and not _is_default(field("loss_chunks"), chunks):
        loss = _loss_of(values)
        if loss in (field("loss").choices or ()) and loss != "chunked":
            out.append(("loss_chunks", "chunked_only", {"loss": loss}))
    if _sent(values.get("optimizer_impl")):
        name = _optimizer_of(values)
        if isinstance(name, str) and name in OPTIMIZER_NAMES:
            known = name in optimizer.OPTIMIZERS or name in optimizer.HF_NAMES
            entry = optimizer.get(name) if known else None
            if entry is not None and not (entry.temporaries or entry.impl_flags):
                out.append(("optimizer_impl", "impl_not_read", {"optimizer": name}))
    out += _per_node(values)
    out += _grpo_only(values)
    out += _objective_only(values)
    out += _tp_only(values)
    out += _cp_only(values)
    out += _fsdp_loading(values)
    return out


#: GRPOTrainer's knobs (cabe.objectives.grpo): they act with ``objective="grpo"`` only; the vLLM ones with use_vllm
GRPO_FIELDS = (
    "num_generations",
    "max_completion_length",
    "generation_batch_size",
    "steps_per_generation",
    "use_vllm",
    "beta",
)
VLLM_FIELDS = ("vllm_mode", "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode")


def _grpo_only(values: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """GRPO's fields with another objective (``grpo_only``), the vLLM ones without ``use_vllm`` (``vllm_only``)."""
    objective = values.get("objective") if _sent(values.get("objective")) else field("objective").default
    given = [n for n in GRPO_FIELDS + VLLM_FIELDS if _sent(values.get(n)) and not _is_default(field(n), values[n])]
    if objective != "grpo":
        return [(n, "grpo_only", {"objective": objective}) for n in given]
    vllm = values.get("use_vllm") is True
    out: list[tuple[str, str, dict[str, Any]]] = [(n, "vllm_only", {}) for n in given if n in VLLM_FIELDS and not vllm]
    # GRPOTrainer scores with TRL's fused log-prob head (cabe.objectives.fused_head), never an SFT loss kernel
    fused = [n for n in ("loss", "loss_chunks") if _sent(values.get(n)) and not _is_default(field(n), values[n])]
    out += [(n, "grpo_fused_head", {}) for n in fused]
    # the policy's rows are prompt + completion tokens (cabe.objectives.grpo): any other --seq would be read by nothing
    p = values["prompt_length"] if _sent(values.get("prompt_length")) else 512  # TrainingSetup.resolved_prompt_length
    c = values["max_completion_length"] if _sent(values.get("max_completion_length")) else None
    c = c if c is not None else field("max_completion_length").default
    seq = values.get("seq")
    if (
        _sent(seq)
        and not _is_default(field("seq"), seq)
        and not (isinstance(p, int) and isinstance(c, int) and seq == p + c)
    ):
        out.append(("seq", "grpo_seq", {}))
    return out


#: the preference trainers' options (cabe.objectives.preference), read with those objectives only
PREFERENCE_FIELDS = ("ref_model", "precompute_ref_log_probs", "loss_type", "use_weighting")
PREFERENCE_OBJECTIVES = ("dpo", "orpo", "kto")
#: the fields every TRL trainer reads (preference and GRPO alike); SFT does not
TRL_FIELDS = ("prompt_length",)


def _objective_only(values: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """A preference trainer's option with another objective (``objective_only``): SFT and GRPO do not read it."""
    objective = values.get("objective") if _sent(values.get("objective")) else field("objective").default
    out: list[tuple[str, str, dict[str, Any]]] = []
    if objective == "sft":
        trl = ", ".join(PREFERENCE_OBJECTIVES + ("grpo",))
        out += [
            (name, "objective_only", {"objectives": trl, "objective": objective})
            for name in TRL_FIELDS
            if _sent(values.get(name)) and not _is_default(field(name), values.get(name))
        ]
    if objective in PREFERENCE_OBJECTIVES:
        return out
    return out + [
        (name, "objective_only", {"objectives": ", ".join(PREFERENCE_OBJECTIVES), "objective": objective})
        for name in PREFERENCE_FIELDS
        if _sent(values.get(name)) and not _is_default(field(name), values.get(name))
    ]


def _tp_only(values: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``loss_parallel`` / ``sequence_parallel`` without tensor parallelism (``tp_only``): they cut what TP cuts."""
    if not _degree_one(values, "tp"):
        return []
    return [
        (name, "tp_only", {})
        for name in ("loss_parallel", "sequence_parallel")
        if _sent(values.get(name)) and not _is_default(field(name), values.get(name))
    ]


def _cp_only(values: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``cp_impl`` without context parallelism (``cp_only``): it says how the cp group's attention communicates."""
    sent = _sent(values.get("cp_impl")) and not _is_default(field("cp_impl"), values.get("cp_impl"))
    return [("cp_impl", "cp_only", {})] if sent and _degree_one(values, "cp") else []


def _degree_one(values: Mapping[str, Any], name: str) -> bool:
    """The parallel degree ``name`` (``tp``, ``cp``) is 1, as given or by default; a bad value is not (TrainingSetup
    refuses it with its own error)."""
    v = values.get(name) if _sent(values.get(name)) else field(name).default
    try:
        return int(str(v)) == 1
    except ValueError:
        return False


def _fsdp_loading(values: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``cpu_ram_efficient_loading``, ``reshard_after_forward`` or ``fsdp_wrap`` changed beside a strategy that is not FSDP
    (``fsdp_only``): only accelerate's FSDP reads the first (cabe.parallel.loading), only FSDP's units the second
    (cabe.parallel.fsdp); the other engines load and gather their own way whatever they say."""
    shard = values.get("shard") if _sent(values.get("shard")) else field("shard").default
    if shard in ("fsdp", "fsdp-hybrid"):
        return []
    return [
        (name, "fsdp_only", {"shard": shard})
        for name in ("cpu_ram_efficient_loading", "reshard_after_forward", "fsdp_wrap")
        if _sent(values.get(name)) and not _is_default(field(name), values.get(name))
    ]


def _per_node(values: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``gpus_per_node`` on one GPU (``one_gpu_per_node``): it splits the GPUs into nodes (hybrid sharding's group,
    the host RAM per node: cabe.parallel.plan), and one GPU is one node whatever it says."""
    per = values.get("gpus_per_node")
    if not _sent(per) or _is_default(field("gpus_per_node"), per):
        return []
    gpus = values.get("gpus") if _sent(values.get("gpus")) else field("gpus").default
    try:
        one = int(str(gpus)) == 1
    except ValueError:
        return []  # a bad value TrainingSetup refuses with its own error
    return [("gpus_per_node", "one_gpu_per_node", {})] if one else []


def _model_only(values: Mapping[str, Any], flagged: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """Setup fields given with only a parameter count that its formula does not read (``needs_model``):
    the lesson's formula reads :data:`LESSON_FIELDS`, the simple mode (``bytes_per_param``) none."""
    used = () if _sent(values.get("bytes_per_param")) else LESSON_FIELDS
    out: list[tuple[str, str, dict[str, Any]]] = []
    for f in SETUP_FIELDS:
        v = values.get(f.name)
        if f.name in used or f.name in flagged or f.name == "method" or not _sent(v) or _is_default(f, v):
            continue
        out.append((f.name, "needs_model", {}))
    return out


def state_fields() -> tuple[str, ...]:
    """The setup fields that change the model states: the cache key of :mod:`cabe.analytic`."""
    return tuple(f.name for f in SETUP_FIELDS if f.states)


def defaults(command: str = "estimate") -> dict[str, Any]:
    """Every field of a command with its static default (see :func:`resolve_defaults`)."""
    return {f.name: f.default for f in fields_for(command, output=False)}


def _given(v: Any) -> bool:
    return v is not None and v != ""


#: ``precision`` shorthands: (dtype, autocast). ``bf16-amp`` / ``fp16-amp``: fp32 weights under
#: autocast; ``bf16`` / ``fp16``: 16-bit weights, no autocast; ``bf16-mixed`` / ``fp16-mixed``: 16-bit
#: weights under autocast (``from_pretrained(dtype=torch.bfloat16)`` + ``Trainer(bf16=True)``).
PRECISIONS: dict[str, tuple[str, str]] = {
    "fp32": ("fp32", "none"),
    "bf16-amp": ("fp32", "bf16"),
    "fp16-amp": ("fp32", "fp16"),
    "bf16": ("bf16", "none"),
    "fp16": ("fp16", "none"),
    "bf16-mixed": ("bf16", "bf16"),
    "fp16-mixed": ("fp16", "fp16"),
}


def precision_name(dtype: str, autocast: str) -> str | None:
    """The shorthand of a (dtype, autocast) pair, or None."""
    return next((k for k, v in PRECISIONS.items() if v == (dtype, autocast)), None)


def _resolve_precision(values: Mapping[str, Any], out: dict[str, Any]) -> None:
    """``precision``, when given, sets ``dtype`` and ``autocast``; given as well, they must agree."""
    prec = values.get("precision")
    if not _given(prec) or not isinstance(prec, str) or prec not in PRECISIONS:
        return  # not given, or a bad value TrainingSetup refuses with a typed error
    for name, implied in zip(("dtype", "autocast"), PRECISIONS[prec], strict=True):
        given = values.get(name)
        if _given(given) and given != implied:
            raise InvalidValueError("precision_conflict", name, value=given, precision=prec, implied=implied)
        out[name] = implied


def resolve_defaults(values: Mapping[str, Any], command: str = "estimate") -> dict[str, Any]:
    """The setup a request describes: the given values (None and "" mean not given) over the defaults,
    with the defaults that depend on other fields decided here — the one place that does it.

    Returns every :data:`SETUP_FIELDS` name (for ``api.*`` / training commands) or every field of
    ``command``, values as given (not yet validated).
    """
    pool = SETUP_FIELDS if command in _TRAINING or command == "from-config" else fields_for(command, output=False)
    out = {f.name: values[f.name] if _given(values.get(f.name)) else f.default for f in pool}
    if _given(values.get("recipe")) and "recipe" in out:
        _resolve_recipe(values, out)
    if "precision" in out:
        _resolve_precision(values, out)
    return out


def _resolve_recipe(values: Mapping[str, Any], out: dict[str, Any]) -> None:
    """A recipe's defaults (``cabe/data/recipes/<name>.json``, ``sets``) for the fields not given; a
    given ``precision`` keeps the dtype and autocast it implies, a given ``optimizer`` its own
    implementation."""
    name = values["recipe"]
    if not isinstance(name, str) or name not in recipes.NAMES:
        return  # a bad value TrainingSetup refuses with a typed error
    prec_given = _given(values.get("precision"))
    for key, value in recipes.load(name)["sets"].items():
        if _given(values.get(key)) or (prec_given and key in ("dtype", "autocast")):
            continue
        if key == "optimizer_impl" and _given(values.get("optimizer")):
            continue  # the recipe's implementation is its optimizer's, not one given in its place
        out[key] = tuple(value) if isinstance(value, list) else value


# ---- the command line ----------------------------------------------------------------------------
_GROUP_TITLES = {
    "model": "model",
    "setup": "training setup",
    "gpus": "several GPUs",
    "fit": "make it fit",
    "serving": "serving",
    "trace": "trace",
    "output": "output",
}


def help_text(f: Field, lang: str = "en") -> str:
    """``--help`` text: the catalog sentence, then the choices and the default from the schema."""
    text = t(f.key, lang)
    allowed = f.choices  # catalogs read lazily (choices_from) would import the core on every start
    extra = []
    if allowed is not None:
        extra.append(" | ".join(allowed))
    if f.default is not None and f.default != () and f.type is not bool and not f.depends_on:
        shown = ",".join(f.default) if isinstance(f.default, tuple) else f.default
        extra.append(f"default {shown}")
    if f.unit:
        extra.append(f.unit)
    return f"{text} ({'; '.join(extra)})" if extra else text


def add_arguments(
    parser: argparse.ArgumentParser,
    command: str,
    *,
    groups: Iterable[str] | None = None,
    only: Iterable[str] | None = None,
) -> None:
    """Add the flags of ``command``'s fields to ``parser`` (one argparse group per schema group).

    Values arrive as the strings typed (``None`` when not given), converted and checked by
    :func:`values_from_args` and the core, so bad input is a typed error; fields marked ``cli_typed``
    are converted by argparse. ``groups`` / ``only`` restrict which fields are added.
    """
    wanted_groups = set(groups) if groups is not None else None
    wanted = set(only) if only is not None else None
    sections: dict[str, argparse._ArgumentGroup] = {}
    for f in fields_for(command):
        if not f.flags or (wanted_groups is not None and f.group not in wanted_groups):
            continue
        if wanted is not None and f.name not in wanted:
            continue
        if f.group not in sections:
            sections[f.group] = parser.add_argument_group(_GROUP_TITLES[f.group])
        add_flag(sections[f.group], f, command)


def add_flag(group: argparse._ArgumentGroup | argparse.ArgumentParser, f: Field, command: str) -> None:
    """Add one field's flag(s) to a parser or argument group (see :func:`add_arguments`)."""
    flags = f.flags + (tuple("--" + a for a in f.aliases) if command == "lora" else ())
    kw: dict[str, Any] = {"dest": f.dest, "help": help_text(f)}
    if f.type is bool:
        kw.update(action="store_true", default=f.default if f.cli_default else None)
        group.add_argument(*flags, **kw)
        if f.negatable:
            group.add_argument("--no-" + flags[0][2:], dest=f.dest, action="store_false")
        return
    if f.cli_default:
        kw["default"] = f.default
    if f.cli_typed:
        kw["type"] = f.type
        if f.choices is not None:
            kw["choices"] = f.choices
    if command in f.required_for:
        kw["required"] = True
    if f.metavar:
        kw["metavar"] = f.metavar
    group.add_argument(*flags, **kw)


def values_from_args(args: argparse.Namespace, command: str, *, groups: Iterable[str] | None = None) -> dict[str, Any]:
    """The request dict of the fields given on the command line, numbers converted (integers first,
    then real numbers: the order errors are reported in); ``lang`` / ``units`` left out; ``groups``
    restricts it to those schema groups."""
    body: dict[str, Any] = {}
    wanted = set(groups) if groups is not None else None
    taken = [f for f in fields_for(command, output=False) if f.flags and (wanted is None or f.group in wanted)]
    for f in taken:
        v = getattr(args, f.dest, None)
        if f.type is tuple and isinstance(v, str) and not v.replace(",", "").strip():
            raise InvalidValueError("empty_list", f.name)  # `--lora-targets ""`: given, but blank
        if v is not None and f.type in (str, bool, tuple, dict):
            body[f.name] = v
    for kind, convert in ((int, to_int), (float, to_float)):
        for f in taken:
            v = getattr(args, f.dest, None)
            if v is not None and f.type is kind:
                body[f.name] = v if f.cli_typed else convert(f.name, v)
    return body


def to_int(name: str, text: Any) -> int:
    """A command-line integer (``1_000`` allowed) or a typed ``not_integer`` error."""
    try:
        return int(str(text).replace("_", ""))
    except ValueError:
        raise InvalidValueError("not_integer", name, value=text) from None


def to_float(name: str, text: Any) -> float:
    """A command-line real number (``7,5`` and ``7.5``) or a typed ``not_number`` error."""
    try:
        return float(str(text).replace(",", "."))
    except ValueError:
        raise InvalidValueError("not_number", name, value=text) from None


# ---- docs/options.md -----------------------------------------------------------------------------
def _cell(f: Field) -> tuple[str, str, str, str]:
    allowed = f.allowed()
    if allowed is not None:
        values = " \\| ".join(f"`{a}`" for a in allowed)
    elif f.minimum is not None or f.maximum is not None:
        lo = "" if f.minimum is None else f"{'>' if f.exclusive_minimum else '≥'} {_json_number(f.minimum, f.type)}"
        hi = "" if f.maximum is None else f"≤ {_json_number(f.maximum, f.type)}"
        values = ", ".join(x for x in (lo, hi) if x)
    else:
        values = {bool: "on / off", tuple: "comma list", dict: "JSON object"}.get(f.type, "text")
    if f.depends_on:
        default = f"by {', '.join(f.depends_on)} (`resolve_defaults`)"
    elif f.default is None or f.default == ():
        default = "—"
    elif isinstance(f.default, tuple):
        default = "`" + ",".join(f.default) + "`"
    else:
        default = f"`{f.default}`"
    flags = ", ".join(f"`{x}`" for x in f.flags) or "(HTTP only)"
    return flags, values, default, f.unit or ""


def markdown(lang: str = "en") -> str:
    """The options table of docs/options.md, one section per group."""
    lines = [
        "# Options",
        "",
        "<!-- Generated by `python -m cabe.schema --markdown > docs/options.md` from src/cabe/schema.py;"
        " do not edit by hand. -->",
        "",
        "Every field of a request, as the command line, the HTTP API and the Python API spell it.",
        "Names are snake_case in JSON and Python, dashed on the command line.",
    ]
    for group in GROUPS:
        rows = [f for f in FIELDS if f.group == group]
        lines += ["", f"## {_GROUP_TITLES[group].capitalize()}", ""]
        lines.append("| field | flags | values | default | unit | commands | states | help |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for f in rows:
            flags, values, default, unit = _cell(f)
            cmds = ", ".join(f.commands)
            lines.append(
                f"| `{f.name}` | {flags} | {values} | {default} | {unit} | {cmds} | {'yes' if f.states else ''} "
                f"| {t(f.key, lang)} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cabe.schema", description="The request schema of cabe.")
    ap.add_argument("--markdown", action="store_true", help="print the options table (docs/options.md)")
    ap.add_argument("--lang", default="en")
    args = ap.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown(args.lang))
        return 0
    for f in FIELDS:
        print(f"{f.name:<24} {f.group:<8} {', '.join(f.commands)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
