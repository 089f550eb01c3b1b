"""Golden numbers from the seeds (docs/seeds/004-calculadora-vram.txt: V = N·B + A; docs/seeds/000-lesson-llama-7b.txt: the LLaMA-7B lesson)."""

import json

import pytest

from cabe.analytic import estimate_lesson, estimate_simple
from cabe.cli import main
from cabe.training import TrainingSetup
from cabe.units import GB, GiB


def test_seed_004_worked_example_112_gb():
    # seed 004: "M = 7 × 16 = 112 GB", "V = 112 + 0 = 112 GB"
    r = estimate_simple(7, 16, 0)
    assert r.total_bytes == 112 * GB
    assert r.components == {"model_states": 112 * GB, "activations": 0}


def test_seed_004_with_20_gb_activations_is_132_gb():
    r = estimate_simple(7, 16, 20)
    assert r.total_bytes == 132 * GB
    assert r.components["activations"] == 20 * GB


@pytest.mark.parametrize("bpp,expected_gb", [(16, 112), (12, 84), (8, 56)])
def test_seed_presets(bpp, expected_gb):
    assert estimate_simple(7, bpp).total_bytes == expected_gb * GB


def test_cli_simple_mode_prints_gb_and_gib(capsys):
    assert main(["estimate", "--params", "7", "--bytes-per-param", "16", "--lang", "en"]) == 0
    out = capsys.readouterr().out
    assert "112 GB (104.3 GiB)" in out
    assert main(["estimate", "--params", "7", "--bytes-per-param", "16", "--activations-gb", "20", "--lang", "en"]) == 0
    assert "132 GB (122.9 GiB)" in capsys.readouterr().out


def test_cli_simple_json(capsys):
    assert main(["estimate", "--params", "7", "--bytes-per-param", "16", "--activations-gb", "20", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total_bytes"] == 132_000_000_000
    assert data["components"]["activations"] == 20_000_000_000


def test_lesson_fp32_adam_components():
    # lesson 000: weights 26.1, gradients 26.1, Adam 52.2 (GiB, which the lesson labels GB)
    r = estimate_lesson(7, TrainingSetup(precision="fp32", optimizer="adamw"))
    assert round(r.components["weights"] / GiB, 1) == 26.1
    assert round(r.components["gradients"] / GiB, 1) == 26.1
    assert round(r.components["optimizer"] / GiB, 1) == 52.2
    assert round(r.total_bytes / GiB, 1) == 104.3


def test_lesson_mixed_precision_shows_lesson_figure_and_correct_one():
    r = estimate_lesson(7, TrainingSetup(precision="bf16-amp", optimizer="adamw"))
    assert r.lesson["lesson_gib"] == 78.4  # the lesson's "SUBTOTAL: 78.4 GB"
    assert r.lesson["bytes_per_param"] == 16
    assert r.total_bytes == 112 * GB  # 16 B/param × 7e9, the seed's figure
    assert r.components["master_weights"] == 28 * GB


def test_cli_lesson_output_names_both(capsys):
    assert main(["estimate", "--params", "7", "--precision", "bf16-amp", "--lang", "en", "--units", "GiB"]) == 0
    out = capsys.readouterr().out
    assert "78.4 GiB" in out and "104.3 GiB" in out and "master" in out


def test_cli_lesson_fp32_prints_the_lessons_gib(capsys):
    # the issue: "shows weights 26.1 GiB, gradients 26.1 GiB and Adam state 52.2 GiB"
    assert main(["estimate", "--params", "7", "--precision", "fp32", "--optimizer", "adamw", "--lang", "en"]) == 0
    out = capsys.readouterr().out
    assert out.count("26.1 GiB") == 2 and "52.2 GiB" in out
