"""Trainers' recipes as data: what a run under a given trainer sets by default.

Each recipe is ``cabe/data/recipes/<name>.json``, read lazily (:func:`load`):

* ``project``, ``version``: the trainer and the version of its code the facts were read from;
* ``sets``: the defaults it gives request fields cabe already has (``dtype``, ``autocast``,
  ``optimizer``, ``checkpointing``, ``loss``...); :func:`cabe.schema.resolve_defaults` applies them to
  the fields a request does not give, so every one can be overridden;
* ``facts``: one entry per topic (``loss``, ``kbit_preparation``, ``checkpointing``, ``adapter_dtype``,
  ``padding``, ``dtype``, ``optimizer``, ``compile``), each with ``value`` (the trainer's own spelling),
  ``source`` (file:line of that project's code), ``field`` (the request field it sets, or null) and
  ``modelled``: false when cabe cannot model it yet (``unmodelled``: the catalog code saying why).

No sentence lives here; ``recipe.*`` keys in the catalogs word the topics and reasons.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

#: the recipes, in the order ``cabe recipes`` lists them (a test checks one file per name)
NAMES: tuple[str, ...] = ("hf-trainer", "trl-sft", "axolotl", "llama-factory", "torchtune", "unsloth", "litgpt")

#: the topics every recipe file states, in order
TOPICS: tuple[str, ...] = (
    "loss",
    "kbit_preparation",
    "checkpointing",
    "adapter_dtype",
    "padding",
    "dtype",
    "optimizer",
    "compile",
)


@cache
def load(name: str) -> dict[str, Any]:
    """The recipe file ``name`` (one of :data:`NAMES`) as a dict."""
    if name not in NAMES:
        raise KeyError(name)
    text = resources.files("cabe.data").joinpath("recipes").joinpath(f"{name}.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def unmodelled(name: str) -> tuple[str, ...]:
    """The topics of recipe ``name`` cabe does not model yet."""
    return tuple(f["topic"] for f in load(name)["facts"] if not f["modelled"])
