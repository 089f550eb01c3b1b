"""YAML files whose anchors and aliases expand past any training config (issue 29, item 3).

PyYAML's composer hands back the anchored node itself for every alias, so "nine aliases nested eight deep"
is 81 nodes in the file and 9**8 = 43,046,721 items once walked: cabe walked it and stayed busy for minutes.
The loader now counts the expanded document before building it and refuses it in one sentence.
"""

from __future__ import annotations

import time

import pytest

from cabe.cli import main
from cabe.configs import _base
from cabe.errors import ConfigError


def _laughs(levels: int = 8, width: int = 9) -> str:
    """The "billion laughs": level i is a list of ``width`` aliases of level i - 1 (width**levels items)."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\nmodel_name_or_path: meta-llama/Llama-3.1-8B\n"


def _merges(levels: int = 8, width: int = 9) -> str:
    """The same through merge keys: ``<<: [*a, *a, ...]`` copies the merged pairs at every level."""
    lines = ["a0: &a0 {k0: 1, k1: 2}"]
    lines += [
        f"a{i}: &a{i} {{<<: [" + ", ".join([f"*a{i - 1}"] * width) + f"], z{i}: 1}}" for i in range(1, levels + 1)
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text",
    [_laughs(), _merges(), "a: &a [1, *a]\n", "a: &a {b: *a}\n"],
    ids=["billion-laughs-9^8", "merge-keys-9^8", "list-inside-itself", "map-inside-itself"],
)
def test_expanding_yaml_is_refused_within_a_second(tmp_path, capsys, text):
    path = tmp_path / "train.yaml"
    path.write_text(text)
    start = time.perf_counter()
    rc = main(["from-config", str(path), "--lang", "en"])
    elapsed = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert f"{path} holds more than 100,000 items, counting each YAML alias as the part it repeats" in err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert elapsed < 1.0, f"{elapsed:.2f} s"


def test_the_same_in_spanish(tmp_path, capsys):
    path = tmp_path / "train.yaml"
    path.write_text(_laughs())
    assert main(["from-config", str(path), "--lang", "es"]) == 2
    assert "contiene más de 100.000 elementos, contando cada alias de YAML" in capsys.readouterr().err


def test_the_limit_is_on_the_expansion_not_on_aliases(tmp_path):
    """Aliases that expand to little are fine (axolotl and torchtune files use anchors). Level 0 is a list of 9
    scalars (10 nodes), level i a list of 9 level i - 1 (1 + 9 * size): 10, 91, 820, 7,381, 66,430, 597,871.
    Four levels: those five lists + the root + 6 keys + 1 value = 74,740 items, under 100,000; five are over."""
    import yaml

    assert _base._expanded_items(yaml.compose(_laughs(levels=4)), "four.yaml") == 74_740
    small = _base.load_yaml(_laughs(levels=4), "four.yaml")
    assert len(small["a4"]) == 9 and small["a4"][0] is small["a3"]
    with pytest.raises(ConfigError) as err:
        _base.load_yaml(_laughs(levels=5), "five.yaml")
    assert err.value.code == "cfg_too_many_items"


def test_expanded_count_is_exact():
    """The count of nodes with every alias expanded: ``a: &x [1, 2]`` and ``b: *x`` are the root mapping (1),
    two keys (2), two lists (2) and four scalars (4) = 9."""
    import yaml

    node = yaml.compose("a: &x [1, 2]\nb: *x\n")
    assert _base._expanded_items(node, "t.yaml") == 9
