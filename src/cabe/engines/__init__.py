"""Serving engines as they account memory: how many tokens and sequences of a length fit on a card.

* ``hf``: transformers' ``generate`` (:mod:`cabe.inference`: the batch and context that fit);
* ``vllm``: :mod:`cabe.engines.vllm` (``gpu_memory_utilization``, the profile run, KV cache groups and blocks);
* ``sglang``: :mod:`cabe.engines.sglang` (``mem_fraction_static``, the token pool);
* ``llamacpp``: :mod:`cabe.engines.llamacpp` (GGUF tensor types, KV types, the compute buffer).
"""

from __future__ import annotations

ENGINES = ("hf", "vllm", "sglang", "llamacpp")
