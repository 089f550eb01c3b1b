"""torchtune's activation offloading as the torchtune reader reads it (torchtune commit bd2a0fc)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cabe import configs
from cabe.configs import _base
from cabe.errors import ConfigError

FILE = Path(__file__).parent / "files" / "torchtune_8B_qlora_single_device.yaml"


def _with(**changes: object) -> dict:
    data = dict(_base.read(FILE))
    data.update(changes)
    return data


def test_offloading_with_checkpointing_is_the_layers_inputs_on_the_host():
    s = configs.read_source(_with(enable_activation_checkpointing=True, enable_activation_offloading=True))
    assert s.fields["checkpointing"] is True and s.fields["offload_activations"] is True


def test_offloading_without_checkpointing_is_refused_as_torchtune_refuses_it():
    # recipes/lora_finetune_single_device.py:186-193: "enable_activation_offloading should only be True when
    # enable_activation_checkpointing is True"
    with pytest.raises(ConfigError) as e:
        configs.read_source(_with(enable_activation_checkpointing=False, enable_activation_offloading=True))
    assert (e.value.code, e.value.field) == ("cfg_contradiction", "offload_activations")
    assert "enable_activation_checkpointing" in e.value.params["source"]
