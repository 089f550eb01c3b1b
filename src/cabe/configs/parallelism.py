"""accelerate's ``ParallelismConfig`` (accelerate 1.16 parallelism_config.py): its context-parallel sizes as cabe's
``cp`` / ``cp_impl``. Read from accelerate's YAML (``parallelism_config: {parallelism_config_cp_size: ...}``, the
keys ``accelerate config`` writes: commands/config/cluster.py) and from TrainingArguments' ``parallelism_config``
(the same fields without the prefix)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe.configs import _base
from cabe.configs._base import Collector

PREFIX = "parallelism_config_"
#: sizes the world's layout implies (dp) or that cabe does not read from this block (tp: its own field)
IMPLIED = {"dp_replicate_size", "dp_shard_size"}  # gpus / (cp × tp × pp)
NOT_READ = {"tp_size", "sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation"}


def read(c: Collector, key: str, block: Mapping[str, Any]) -> None:
    """``cp_size`` (torch's ring, rotated by ``cp_comm_strategy``, ``allgather`` by default: accelerate's
    ``TorchContextParallelConfig``) or ``sp_size`` with ``sp_backend`` ``deepspeed`` (DeepSpeed-Ulysses)."""
    values = {str(k).removeprefix(PREFIX): (f"{key}.{k}", v) for k, v in block.items()}
    cp = _base.as_int(values["cp_size"][1], "cp_size") if "cp_size" in values else 1
    sp = _base.as_int(values["sp_size"][1], "sp_size") if "sp_size" in values else 1
    for name, (source, value) in values.items():
        if name == "cp_size":
            if cp > 1:
                c.set("cp", cp, source)
            else:
                c.use(source)
        elif name == "cp_comm_strategy" and cp > 1:
            c.set_known("cp_impl", value if value in ("allgather", "alltoall") else None, source)
        elif name == "sp_size":
            if sp > 1:
                c.set("cp", sp, source)
                c.set("cp_impl", "ulysses", source)
            else:
                c.use(source)
        elif name == "sp_backend" and sp > 1:
            c.set_known("cp_impl", "ulysses" if value == "deepspeed" else None, source)
        elif name == "cp_backend" and cp > 1:
            if value == "torch":
                c.use(source)
            else:
                c.ignore(source, "unsupported_value")
        elif name in IMPLIED:
            c.use(source)
        elif name in NOT_READ:
            c.ignore(source, "not_modeled")
        else:
            c.ignore(source, "no_effect")
