"""CabeCallback on a real (CPU) Trainer run of a tiny Llama, and its GPU comparison with a fake CUDA."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cabe.integrations.transformers import CabeCallback, request_for_run  # noqa: E402


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(cfg)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 16, seq: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 128, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def training_args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=4,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        learning_rate=1e-3,
        seed=0,
    )
    base.update(kw)
    return transformers.TrainingArguments(**base)


def state_after(steps: int):
    return types.SimpleNamespace(global_step=steps, is_world_process_zero=True)


def test_trainer_run_logs_the_estimate_and_records_no_cuda(tmp_path):
    lines: list[str] = []
    cb = CabeCallback(compare_after_steps=3, seq=16, log=lines.append)
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = transformers.Trainer(
        model=model, args=training_args(tmp_path), train_dataset=RandomTokens(), callbacks=[cb]
    )
    out = trainer.train()
    assert out.global_step == 4  # training ran its course: the callback stopped nothing
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # and the model trained
    assert cb.report is not None and cb.report.total_bytes > 0
    assert cb.request["batch"] == 2 and cb.request["grad_accum"] == 2 and cb.request["seq"] == 16
    assert (cb.request["dtype"], cb.request["autocast"]) == ("fp32", "none")  # fp32 weights, bf16=fp16=False
    assert cb.report.parameters == sum(p.numel() for p in model.parameters())
    assert any(line.startswith("Peak memory:") for line in lines)
    assert any("estimated peak" in line for line in lines)
    if torch.cuda.is_available():  # pragma: no cover - CPU CI
        pytest.skip("has CUDA")
    assert cb.fit == {"skipped": "no_cuda"}
    assert cb.comparison == {"skipped": "no_cuda"}
    assert any("no CUDA device" in line for line in lines)


def test_peft_model_is_unwrapped(tmp_path):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        tiny_model(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    args = training_args(tmp_path, bf16=False, gradient_checkpointing=True, optim="adamw_torch_fused")
    request, _combined = request_for_run(model, args, seq=32)
    assert request["method"] == "lora" and request["lora_rank"] == 4 and request["lora_alpha"] == 8
    assert request["lora_targets"] == ("q_proj", "v_proj")
    assert request["checkpointing"] is True and request["optimizer_impl"] == "fused"
    assert request["config"]["model_type"] == "llama" and "model" not in request
    # the transformers the run imports decides its line (cabe.transformers_line)
    assert request["transformers"] == transformers.__version__
    from cabe import api

    report = api.build(request)
    n_lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert report.trainable_parameters == n_lora


def test_bf16_flags_and_bnb_config_are_read(tmp_path):
    model = tiny_model().to(torch.bfloat16)
    model.config.quantization_config = {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_compute_dtype": "bfloat16",
        "bnb_4bit_use_double_quant": True,
    }
    args = training_args(tmp_path, bf16=True)
    request, _ = request_for_run(model, args, seq=16)
    assert request["method"] == "qlora" and request["autocast"] == "bf16" and request["quant"] == "nf4"
    assert "quantization_config" not in request["config"]


class FakeCuda:
    def __init__(self, allocated: int, reserved: int, total: int) -> None:
        self.allocated, self.reserved, self.total = allocated, reserved, total

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: self.allocated)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a, **k: self.reserved)
        monkeypatch.setattr(
            torch.cuda,
            "get_device_properties",
            lambda *a, **k: types.SimpleNamespace(total_memory=self.total, name="Fake GPU"),
        )


def begin(cb, tmp_path, model=None):
    args = training_args(tmp_path)
    control = transformers.TrainerControl()
    cb.on_train_begin(args, state_after(0), control, model=model or tiny_model())
    return args, control


def test_comparison_with_a_fake_cuda(tmp_path, monkeypatch):
    lines: list[str] = []
    cb = CabeCallback(compare_after_steps=3, seq=16, log=lines.append)
    est = None
    fake = FakeCuda(allocated=0, reserved=0, total=80 * 10**9)
    fake.install(monkeypatch)
    args, control = begin(cb, tmp_path)
    est, est_res = cb.report.total_bytes, cb.report.reserved_bytes
    fake.allocated, fake.reserved = est * 2, est_res * 4  # measured twice / four times the estimate
    assert cb.fit["fits"] is True and cb.fit["memory_bytes"] == 80 * 10**9
    for step in (1, 2):
        cb.on_step_end(args, state_after(step), control)
        assert cb.comparison is None  # not before N steps
    cb.on_step_end(args, state_after(3), control)
    c = cb.comparison
    assert c["steps"] == 3 and c["estimated_bytes"] == est and c["measured_allocated_bytes"] == 2 * est
    assert c["error"] == pytest.approx(-0.5) and c["error_reserved"] == pytest.approx(-0.75)
    assert any("-50.0%" in line and "-75.0%" in line for line in lines)
    fake.allocated = 1
    cb.on_step_end(args, state_after(4), control)
    assert cb.comparison is c  # compared once
    # the control flags are untouched
    assert not (control.should_training_stop or control.should_save or control.should_log or control.should_evaluate)


def test_warns_when_it_will_not_fit(tmp_path, monkeypatch):
    FakeCuda(allocated=1, reserved=1, total=1000).install(monkeypatch)
    cb = CabeCallback(seq=16, log=lambda s: None)
    with pytest.warns(ResourceWarning, match="will probably run out of memory"):
        begin(cb, tmp_path)
    assert cb.fit["fits"] is False and cb.fit["needed_bytes"] == cb.report.device_bytes


def test_a_bad_estimate_is_logged_not_raised(tmp_path):
    lines: list[str] = []
    cb = CabeCallback(seq=16, log=lines.append)
    model = tiny_model()
    model.config.model_type = "no-such-architecture"
    model.config.hidden_size = -1
    begin(cb, tmp_path, model)
    assert cb.report is None and cb.error is not None and cb.error["code"]
    assert lines and lines[0].startswith("cabe: could not estimate")
