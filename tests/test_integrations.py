"""Compiling the way users do: `samhq_fx.compile_encoder` under plain torch.compile use, inside HF `Trainer`
(passed in, or by `SamHQCompileCallback`) and inside a Lightning `configure_model`, on a tiny SamHQModel in
fp32 on CPU. Each compiles the vision encoder only, fuses its rel-pos attention, and its first loss is
eager's. `TrainingArguments(torch_compile_backend="samhq")` is refused by accelerate; a test says so.

aot_eager (`samhq.inductor: False`) keeps each test to 7-13 s on a 2-core CPU, about 30 s on a busy one
(Inductor's CPU compile of the encoder takes minutes); the rewrite and its counters are the same. The four that compile are `slow`.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import samhq_fx
from helpers import fresh_compile_state

pytest.importorskip("transformers")

FAST = {"options": {"samhq.inductor": False}}


def tiny_samhq():
    from transformers import SamHQModel

    from samhq_fx.models import random_init_, sam_hq_config

    return random_init_(SamHQModel(sam_hq_config("sdpa"))).train()


class Boxes(torch.utils.data.Dataset):
    """Two 64x64 images, a box each, and a soft target mask at the decoder's resolution."""

    def __init__(self, mask_shape=(256, 256)):
        g = torch.Generator().manual_seed(0)
        self.pixel_values = torch.randn(2, 3, 64, 64, generator=g)
        self.input_boxes = torch.tensor([[[4.0, 4.0, 40.0, 40.0]], [[10.0, 8.0, 60.0, 50.0]]])
        self.target = torch.rand(2, *mask_shape, generator=g)

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return {"pixel_values": self.pixel_values[i], "input_boxes": self.input_boxes[i], "target": self.target[i]}

    def batch(self):
        return {"pixel_values": self.pixel_values, "input_boxes": self.input_boxes, "target": self.target}


def sam_loss(model, batch):
    out = model(pixel_values=batch["pixel_values"], input_boxes=batch["input_boxes"], multimask_output=False,
                hq_token_only=True)
    return F.binary_cross_entropy_with_logits(out.pred_masks[:, 0, 0], batch["target"])


@pytest.fixture
def setup():
    """(fresh tiny model, dataset, eager first loss on the whole dataset as one batch), Dynamo reset."""
    fresh_compile_state()
    model = tiny_samhq()
    with torch.no_grad():
        shape = model(**{k: v for k, v in Boxes().batch().items() if k != "target"}, multimask_output=False,
                      hq_token_only=True).pred_masks.shape[-2:]
    data = Boxes(tuple(shape))
    eager = sam_loss(copy.deepcopy(model), data.batch()).item()
    return model, data, eager


def assert_first_loss(losses, eager):
    assert counters["samhq"]["fused"] == 2  # the windowed and the global layer
    assert len(losses) >= 1 and losses[0] == pytest.approx(eager, rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_compile_encoder_forward_backward_matches_eager(setup):
    model, data, _ = setup
    ref = copy.deepcopy(model)
    assert samhq_fx.compile_encoder(model, **FAST) is model
    assert model.vision_encoder._compiled_call_impl is not None and model._compiled_call_impl is None
    loss, ref_loss = sam_loss(model, data.batch()), sam_loss(ref, data.batch())
    loss.backward()
    ref_loss.backward()
    assert counters["samhq"]["fused"] == 2
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_compile_encoder_finds_the_encoder_and_refuses_bad_input():
    from samhq_fx.compile import find_encoders

    model = tiny_samhq()
    assert find_encoders(model) == [model.vision_encoder]
    assert find_encoders(model.vision_encoder) == [model.vision_encoder]  # SamHQVisionEncoder: itself
    layer = model.vision_encoder.layers[0]
    assert find_encoders(layer) == [layer]  # any module with rel-pos attention
    wrapper = torch.nn.ModuleDict({"student": model, "head": torch.nn.Linear(2, 2)})
    assert find_encoders(wrapper) == [model.vision_encoder]
    with pytest.raises(ValueError, match="`model` must be a torch.nn.Module"):
        samhq_fx.compile_encoder("facebook/sam-vit-base")
    with pytest.raises(ValueError, match=r"`model` \(Linear\) has no `vision_encoder` and no rel-pos attention"):
        samhq_fx.compile_encoder(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="`mode` or `options`, not both.*samhq.mode"):
        samhq_fx.compile_encoder(model, mode="max-autotune", options={"samhq.dump_dir": "d"})
    with pytest.raises(ValueError, match="`options` must be a dict"):
        samhq_fx.compile_encoder(model, options=["samhq.inductor"])
    assert model.vision_encoder._compiled_call_impl is None  # nothing compiled by the refused calls


def _hf_trainer(model, tmp_path, **kw):
    from transformers import Trainer, TrainingArguments

    class LossTrainer(Trainer):
        losses: list[float] = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = sam_loss(model, inputs)
            self.losses.append(loss.item())
            return loss

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, max_steps=2, per_device_train_batch_size=2,
                             save_strategy="no", report_to=[], dataloader_num_workers=0, logging_strategy="no",
                             disable_tqdm=True, learning_rate=1e-3, remove_unused_columns=False)
    LossTrainer.losses = []
    return LossTrainer(model=model, args=args, **kw)


@pytest.mark.slow
def test_hf_trainer_with_compiled_encoder(setup, tmp_path):
    pytest.importorskip("accelerate")
    model, data, eager = setup
    trainer = _hf_trainer(samhq_fx.compile_encoder(model, **FAST), tmp_path, train_dataset=data)
    trainer.train()
    assert_first_loss(trainer.losses, eager)
    assert len(trainer.losses) == 2


@pytest.mark.slow
def test_hf_trainer_with_compile_callback(setup, tmp_path):
    pytest.importorskip("accelerate")
    model, data, eager = setup
    trainer = _hf_trainer(model, tmp_path, train_dataset=data, callbacks=[samhq_fx.SamHQCompileCallback(**FAST)])
    assert model.vision_encoder._compiled_call_impl is not None  # at Trainer(...), so evaluate() is compiled too
    trainer.train()
    assert_first_loss(trainer.losses, eager)


def test_hf_training_arguments_samhq_backend_is_refused(tmp_path):
    """accelerate checks torch_compile_backend against its own DynamoBackend list. If a later version takes
    "samhq", this test skips: compile_encoder stays the way (the TrainingArguments path compiles the whole
    model, mask decoder included)."""
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], torch_compile=True,
                             torch_compile_backend="samhq")
    try:
        Trainer(model=torch.nn.Linear(2, 2), args=args)
    except ValueError as e:
        assert "'SAMHQ' is not a valid DynamoBackend" in str(e)
    else:
        pytest.skip("this accelerate takes torch_compile_backend='samhq': compile_encoder is still the way, "
                    "as the TrainingArguments path compiles the whole model")


def _lightning():
    try:
        import lightning.pytorch as pl
    except ImportError:
        pl = pytest.importorskip("pytorch_lightning")
    return pl


@pytest.mark.slow
def test_lightning_configure_model_compiles_encoder(setup):
    pl = _lightning()
    model, data, eager = setup

    class SamModule(pl.LightningModule):
        def __init__(self, sam):
            super().__init__()
            self.sam = sam
            self.losses = []

        def configure_model(self):
            samhq_fx.compile_encoder(self.sam, **FAST)

        def training_step(self, batch, batch_idx):
            loss = sam_loss(self.sam, batch)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    module = SamModule(model)
    loader = torch.utils.data.DataLoader(data, batch_size=2, num_workers=0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, loader)
    assert_first_loss(module.losses, eager)
    assert len(module.losses) == 2
