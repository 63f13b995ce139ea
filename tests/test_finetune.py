"""examples/finetune_samhq.py and segment.py on a tiny saved SAM-HQ (CPU, samhq rewrite + aot_eager).

Each --train mode runs a few steps from a save_pretrained model with its attention fused, trains what it
says and nothing else, and a run resumed from its mid-way checkpoint gives exactly the uninterrupted run's
losses. Bad --model and --data stop the run before anything is written.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import fresh_compile_state

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
pytest.importorskip("transformers")
pytest.importorskip("PIL")
from safetensors.torch import load_file  # noqa: E402

import finetune_samhq  # noqa: E402
import samhq_data  # noqa: E402
import samhq_model_io  # noqa: E402
import segment  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(saved tiny random SAM-HQ dir, a 10-image mask folder: 9 train, 1 validation)."""
    root = tmp_path_factory.mktemp("finetune")
    samhq_model_io.main([str(root / "model")])
    return root / "model", samhq_data.write_synthetic(root / "data", n=10, size=64, seed=1)


def _run(args):
    fresh_compile_state()
    return finetune_samhq.main(args + ["--samhq-aot-eager", "--device", "cpu"])


def _changed(before: dict, after: dict, prefix: str) -> set[str]:
    return {k for k in before if k.startswith(prefix) and not torch.equal(before[k], after[k])}


@pytest.mark.parametrize("mode", ["decoder", "lora", "full"])
def test_train_mode_fused_trains_its_part_and_resumes_exactly(tiny, tmp_path, mode, capsys):
    model_dir, data = tiny
    common = ["--model", str(model_dir), "--data", str(data), "--train", mode, "--steps", "4", "--eval-every", "2"]
    common += ["--points", "2"] if mode == "lora" else []  # boxes plus points drawn inside the mask
    a = _run(common + ["--out", str(tmp_path / "a"), "--save-every", "2"] + (["--no-check"] if mode != "decoder" else []))
    assert a["fused"] == 2  # the windowed and the global layer; with LoRA adapters on qkv / proj too
    assert len(a["losses"]) == 4 and all(np.isfinite(a["losses"]))
    assert [e["step"] for e in a["evals"]] == [0, 2, 4]  # before training, mid-way, after
    out = capsys.readouterr().out
    assert "attention blocks fused by samhq: 2" in out and ("check: eager loss" in out) == (mode == "decoder")

    ckpt = tmp_path / "a" / "checkpoint-4"
    assert (ckpt / "model" / "model.safetensors").is_file() and (ckpt / "trainer_state.pt").is_file()
    assert (tmp_path / "a" / "checkpoint-2").is_dir() and (tmp_path / "a" / "curves.png").stat().st_size > 0
    assert len((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()) == 4 + 3
    before, after = load_file(model_dir / "model.safetensors"), load_file(ckpt / "model" / "model.safetensors")
    assert _changed(before, after, "mask_decoder.")  # every recipe trains the decoder
    assert not _changed(before, after, "prompt_encoder.") or mode == "full"
    qkv = {k for k in before if k.startswith("vision_encoder.layers.") and ".attn.qkv.weight" in k}
    mlp = {k for k in before if k.startswith("vision_encoder.layers.") and ".mlp." in k}
    assert (_changed(before, after, "vision_encoder.") & qkv == qkv) == (mode != "decoder")  # lora: merged in
    assert (_changed(before, after, "vision_encoder.") & mlp == mlp) == (mode == "full")
    assert (ckpt / "adapter" / "adapter_model.safetensors").is_file() == (mode == "lora")

    # --model, --data, --batch and --seed come from the checkpoint
    workers = ["--workers", "2"] if mode == "full" else []  # loader processes must not change what a step sees
    b = _run(common[4:] + ["--out", str(tmp_path / "b"), "--resume", str(tmp_path / "a" / "checkpoint-2"), "--no-check"]
             + workers)
    assert b["fused"] == 2
    assert (f"resuming from {tmp_path / 'a' / 'checkpoint-2'} at step 2 of 4 (--model {model_dir}, --data {data}, "
            f"--batch 2, --seed 0, --image-size 64)") in capsys.readouterr().out
    assert b["losses"] == a["losses"][2:]  # bit-equal: data, jitter and optimizer state all resume exactly
    assert b["evals"] == a["evals"]  # the log before the checkpoint is carried over
    resumed = load_file(tmp_path / "b" / "checkpoint-4" / "model" / "model.safetensors")
    assert not _changed(after, resumed, "")


@pytest.mark.parametrize("mode", ["decoder", "lora"])
def test_bf16_recipes_hold_frozen_weights_in_bf16_with_the_same_losses(tiny, tmp_path, capsys, mode):
    # --cast-frozen (on by default) changes no bit of the losses, and the checkpoint keeps the base's fp32 weights
    model_dir, data = tiny
    common = ["--model", str(model_dir), "--data", str(data), "--train", mode, "--steps", "2", "--bf16",
              "--no-check", "--eval-every", "2"]
    held = _run(common + ["--out", str(tmp_path / "held")])
    assert "frozen Linear / conv layers kept in bf16: " in capsys.readouterr().out
    plain = _run(common + ["--out", str(tmp_path / "plain"), "--no-cast-frozen"])
    assert "kept in bf16" not in capsys.readouterr().out
    assert held["fused"] == plain["fused"] == 2
    assert held["losses"] == plain["losses"] and held["evals"] == plain["evals"]
    before = load_file(model_dir / "model.safetensors")
    after = load_file(tmp_path / "held" / "checkpoint-2" / "model" / "model.safetensors")
    assert {k: v.dtype for k, v in after.items()} == {k: v.dtype for k, v in before.items()}
    assert not _changed(before, after, "prompt_encoder.") and _changed(before, after, "mask_decoder.")
    mlp = {k for k in before if k.startswith("vision_encoder.layers.") and ".mlp." in k}
    assert mlp and not _changed(before, after, "vision_encoder.") & mlp  # frozen in both: saved as loaded


def test_memory_budget_trains_the_same_steps(tiny, tmp_path, monkeypatch):
    # --memory-budget: the encoder's compile recomputes activations instead of saving them; the same losses
    import samhq_fx.backend

    budgets, real = [], samhq_fx.backend.memory_budget
    monkeypatch.setattr(samhq_fx.backend, "memory_budget", lambda b: budgets.append(b) or real(b))
    model_dir, data = tiny
    common = ["--model", str(model_dir), "--data", str(data), "--train", "full", "--steps", "3", "--no-check"]
    a = _run(common + ["--out", str(tmp_path / "a")])
    assert budgets and set(budgets) == {None}
    budgets.clear()
    b = _run(common + ["--out", str(tmp_path / "b"), "--memory-budget", "0.2"])
    assert b["fused"] == 2 and budgets and set(budgets) == {0.2}  # every graph of the encoder's compile
    np.testing.assert_allclose(b["losses"], a["losses"], rtol=1e-5)


def test_bad_model_and_data_stop_before_writing(tiny, tmp_path):
    model_dir, data = tiny
    from transformers import SamConfig

    SamConfig().save_pretrained(tmp_path / "sam")  # a SAM, not a SAM-HQ
    with pytest.raises(samhq_model_io.ModelError, match=f"{tmp_path / 'sam'}.*not a SAM-HQ"):
        finetune_samhq.main(["--model", str(tmp_path / "sam"), "--out", str(tmp_path / "out")])
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    (broken / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes()[:1000])
    with pytest.raises(samhq_model_io.ModelError, match=f"{broken}: cannot load SAM-HQ weights"):
        finetune_samhq.main(["--model", str(broken), "--out", str(tmp_path / "out")])
    bad = tmp_path / "data"
    shutil.copytree(data, bad)
    (bad / "masks" / "0003.png").unlink()
    with pytest.raises(samhq_data.DatasetError, match=f"{bad / 'images' / '0003.png'}: image with no mask"):
        finetune_samhq.main(["--model", str(model_dir), "--data", str(bad), "--out", str(tmp_path / "out")])
    for budget in (["--memory-budget", "1.5"], ["--memory-budget", "0.2", "--backend", "inductor"]):
        with pytest.raises(SystemExit):
            finetune_samhq.main(budget + ["--out", str(tmp_path / "out")])
    with pytest.raises(samhq_model_io.ModelError, match="saved with --train"):
        finetune_samhq.main(["--resume", str(_fake_checkpoint(tmp_path)), "--train", "full", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def _fake_checkpoint(tmp_path):
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    torch.save({"train": "decoder", "model": "random:tiny", "step": 1}, ckpt / "trainer_state.pt")
    return ckpt


def test_segment_writes_mask_and_overlay_compiled_or_not(tiny, tmp_path, capsys):
    from PIL import Image

    model_dir, data = tiny
    image = data / "images" / "0001.png"  # 48 high, 64 wide
    fresh_compile_state()
    common = ["--model", str(model_dir), "--image", str(image), "--box", "10", "8", "50", "40"]
    eager = segment.main(common + ["--out", str(tmp_path / "eager.png")])
    # SAM's iou_predictions is an unbounded regression (the random model's is negative here): printed clamped
    assert eager["iou_prediction"] < 0 and eager["iou_estimate"] == 0.0
    assert "the model's IoU estimate 0.000 (its iou_predictions output, clamped to [0, 1])" in capsys.readouterr().out
    compiled = segment.main(common + ["--out", str(tmp_path / "c.png"), "--compile", "--samhq-aot-eager"])
    assert compiled["fused"] == 2
    written = np.asarray(Image.open(tmp_path / "eager.png"))
    assert written.shape == (48, 64) and set(np.unique(written)) <= {0, 255}
    assert np.array_equal(written > 0, eager["mask"]) and np.array_equal(eager["mask"], compiled["mask"])
    overlay = Image.open(tmp_path / "eager_overlay.png")
    assert overlay.size == (64, 48) and overlay.mode == "RGB"
    point = segment.main(["--model", str(model_dir), "--image", str(image), "--point", "30", "20",
                          "--out", str(tmp_path / "p.png"), "--overlay", str(tmp_path / "p_over.png")])
    assert point["mask"].shape == (48, 64) and (tmp_path / "p_over.png").is_file()
    (tmp_path / "broken.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(samhq_data.DatasetError, match="broken.png"):
        segment.main(common[:2] + ["--image", str(tmp_path / "broken.png"), "--box", "0", "0", "5", "5",
                                   "--out", str(tmp_path / "x.png")])


def test_commands_from_a_shell(tiny, tmp_path):
    """As a person runs them: --model as a hub id found in the local cache (no network), and bad input as
    one error line naming the file, exit status non-zero, no traceback."""
    import os
    import subprocess

    model_dir, data = tiny
    snapshot = tmp_path / "hub" / "models--someone--tiny-samhq" / "snapshots" / "0123abcd"
    shutil.copytree(model_dir, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abcd")
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    examples = Path(__file__).resolve().parents[1] / "examples"
    done = subprocess.run([sys.executable, str(examples / "segment.py"), "--model", "someone/tiny-samhq", "--image",
                           str(data / "images" / "0000.png"), "--point", "30", "30", "--out", str(tmp_path / "m.png")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "m.png").is_file() and (tmp_path / "m_overlay.png").is_file()
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    (tmp_path / "masks" / "lonely.png").write_bytes((data / "masks" / "0000.png").read_bytes())
    done = subprocess.run([sys.executable, str(examples / "finetune_samhq.py"), "--model", "someone/tiny-samhq",
                           "--data", str(tmp_path), "--out", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"error: {tmp_path / 'masks' / 'lonely.png'}: mask with no image" in done.stderr
    assert not (tmp_path / "out").exists()


def test_random_models_of_every_sam_size():
    # --full --size vit-b|vit-l|vit-h builds SAM-HQ's encoders (the HQ decoder reads the encoder's width)
    cfgs = {kind: samhq_model_io.random_config(kind) for kind in samhq_model_io.RANDOM_KINDS}
    widths = {k: (c.vision_config.hidden_size, c.vision_config.num_hidden_layers, c.vision_config.num_attention_heads)
              for k, c in cfgs.items()}
    assert widths["vit-b"] == (768, 12, 12) and widths["vit-l"] == (1024, 24, 16) and widths["vit-h"] == (1280, 32, 16)
    assert all(c.mask_decoder_config.vit_dim == c.vision_config.hidden_size for k, c in cfgs.items() if k != "tiny")
    with pytest.raises(samhq_model_io.ModelError, match="unknown random model 'vit-g'"):
        samhq_model_io.random_config("vit-g")


def test_models_built_at_other_image_sizes():
    # samhq_fx.models builds SAM-HQ at any multiple of the patch size: at 256, a 16x16 patch grid (global layers'
    # rel-pos tables 2 * 16 - 1 rows, windowed ones 2 * 14 - 1 as at 1024), prompts scaled to 256
    from transformers import SamHQModel

    from samhq_fx.models import sam_hq_config, vision_config

    with torch.device("meta"):  # shapes only
        model = SamHQModel(sam_hq_config("sdpa", full=True, image_size=256))
    enc = model.vision_encoder
    assert enc.pos_embed.shape == (1, 16, 16, 768)
    assert [layer.attn.rel_pos_h.shape[0] for layer in enc.layers] == [27, 27, 31] * 4
    assert model.prompt_encoder.input_image_size == 256 and model.prompt_encoder.image_embedding_size == (16, 16)
    assert sam_hq_config(full=True).vision_config.image_size == 1024 and sam_hq_config().vision_config.image_size == 64
    assert sam_hq_config(image_size=32).prompt_encoder_config.image_embedding_size == 4
    with pytest.raises(ValueError, match="vision_config: `image_size` must be a positive multiple of the patch "
                                         "size 16, got 250"):
        vision_config("vit-b", image_size=250)
    with pytest.raises(ValueError, match="`image_size` must be a positive multiple of the patch size 8, got 36"):
        sam_hq_config(image_size=36)


def test_resized_model_interpolates_position_tables(tiny):
    # a 64x64 model at 32 (and 128): the position embedding bilinear on the patch grid, the global layer's rel-pos
    # tables linear over 2 * grid - 1 rows (half-pixel centres, as SAM's get_rel_pos), every other weight as it was
    from PIL import Image

    model, processor = samhq_model_io.load(str(tiny[0]))
    with torch.no_grad():
        model.vision_encoder.pos_embed.copy_(torch.arange(8.0)[None, :, None, None].expand(1, 8, 8, 64))  # = row
        model.vision_encoder.layers[1].attn.rel_pos_h.copy_(torch.arange(15.0)[:, None].expand(15, 16))
    small, small_processor = samhq_model_io.at_image_size(model, processor, 32)
    assert small.config.vision_config.image_size == small.config.prompt_encoder_config.image_size == 32
    pos = small.vision_encoder.pos_embed
    assert pos.shape == (1, 4, 4, 64)
    torch.testing.assert_close(pos[0, :, :, 0], (2 * torch.arange(4.0) + 0.5)[:, None].expand(4, 4))
    table = small.vision_encoder.layers[1].attn.rel_pos_h
    assert table.shape == (7, 16) and small.vision_encoder.layers[1].attn.rel_pos_w.shape == (7, 16)
    torch.testing.assert_close(table[:, 0], ((torch.arange(7.0) + 0.5) * 15 / 7 - 0.5).clamp(0, 14))
    before, after = model.state_dict(), small.state_dict()
    resized = {k for k in before if before[k].shape != after[k].shape}
    assert resized == {"vision_encoder.pos_embed", "vision_encoder.layers.1.attn.rel_pos_h",
                       "vision_encoder.layers.1.attn.rel_pos_w"}  # the windowed layer's tables keep 2 * 3 - 1 rows
    assert all(torch.equal(before[k], after[k]) for k in before.keys() - resized)
    assert samhq_model_io.at_image_size(model, processor, 64) == (model, processor)

    # the processor resizes the image to 32 on its longest side and scales the box with it
    enc = small_processor(images=[Image.new("RGB", (64, 48))], input_boxes=[[[8, 4, 64, 48]]], return_tensors="pt")
    assert enc["pixel_values"].shape == (1, 3, 32, 32) and enc["reshaped_input_sizes"].tolist() == [[24, 32]]
    assert enc["input_boxes"].tolist() == [[[4, 2, 32, 24]]]
    out = small(pixel_values=enc["pixel_values"].float(), input_boxes=enc["input_boxes"].float(),
                multimask_output=False)
    assert out.pred_masks.shape[-2:] == (16, 16) == (samhq_model_io.mask_size(small),) * 2
    big, _ = samhq_model_io.at_image_size(model, processor, 128)
    assert big.vision_encoder.pos_embed.shape == (1, 16, 16, 64)
    assert big.vision_encoder.layers[1].attn.rel_pos_h.shape[0] == 31
    with pytest.raises(samhq_model_io.ModelError, match="--image-size 36: must be a positive multiple of the model's "
                                                        "patch size 8"):
        samhq_model_io.load(str(tiny[0]), image_size=36)


def test_train_at_a_smaller_image_size_resume_and_segment(tiny, tmp_path, capsys):
    # a 64x64 checkpoint trained at 32 (4x4 patches): fused, finite, checkpoints saved at 32 that resume exactly
    # and segment at 32; bf16 decoder (its checkpoint goes into a base reloaded at 32) and LoRA (its adapter merges
    # into a base reloaded at 32)
    from transformers import SamHQConfig

    model_dir, data = tiny
    common = ["--model", str(model_dir), "--data", str(data), "--steps", "4", "--eval-every", "2", "--image-size", "32"]
    a = _run(common + ["--out", str(tmp_path / "a"), "--save-every", "2", "--bf16"])
    out = capsys.readouterr().out
    assert a["fused"] == 2 and len(a["losses"]) == 4 and all(np.isfinite(a["losses"]))
    assert ("--image-size 32 (the model's own is 64): images, masks and prompts resized to 32; position embedding "
            "interpolated from 8x8 to 4x4 patches, global rel-pos tables from 15 to 7 rows") in out
    assert "images 32x32" in out and "check: eager loss" in out
    ckpt = tmp_path / "a" / "checkpoint-4" / "model"
    assert SamHQConfig.from_pretrained(ckpt).vision_config.image_size == 32
    weights = load_file(ckpt / "model.safetensors")
    assert weights["vision_encoder.pos_embed"].shape == (1, 4, 4, 64)
    assert weights["vision_encoder.layers.1.attn.rel_pos_h"].shape == (7, 16)
    assert all(w.dtype == torch.float32 for w in weights.values())

    b = _run(common[4:-2] + ["--out", str(tmp_path / "b"), "--resume", str(tmp_path / "a" / "checkpoint-2"),
                             "--no-check", "--bf16"])
    assert b["losses"] == a["losses"][2:] and b["fused"] == 2
    with pytest.raises(SystemExit):
        _run(["--resume", str(tmp_path / "a" / "checkpoint-2"), "--image-size", "64", "--out", str(tmp_path / "c")])
    assert "was trained at --image-size 32, not 64" in capsys.readouterr().err and not (tmp_path / "c").exists()

    image = data / "images" / "0001.png"  # 48 high, 64 wide: resized to 24 x 32 for the model
    fresh_compile_state()
    seg = segment.main(["--model", str(ckpt), "--image", str(image), "--box", "10", "8", "50", "40",
                        "--out", str(tmp_path / "m.png"), "--compile", "--samhq-aot-eager"])
    assert seg["mask"].shape == (48, 64) and seg["fused"] == 2

    lora = ["--model", str(model_dir), "--data", str(data), "--train", "lora", "--steps", "2", "--image-size", "32",
            "--no-check"]
    c = _run(lora + ["--out", str(tmp_path / "lora"), "--save-every", "1"])
    assert c["fused"] == 2 and all(np.isfinite(c["losses"]))
    merged = tmp_path / "lora" / "checkpoint-2" / "model"
    assert load_file(merged / "model.safetensors")["vision_encoder.pos_embed"].shape == (1, 4, 4, 64)
    assert segment.main(["--model", str(merged), "--image", str(image), "--point", "30", "20",
                         "--out", str(tmp_path / "l.png")])["mask"].shape == (48, 64)
    d = _run(lora[2:-3] + ["--no-check", "--out", str(tmp_path / "lora2"),
                           "--resume", str(tmp_path / "lora" / "checkpoint-1")])
    assert d["losses"] == c["losses"][1:]


def test_backend_none_says_it_runs_eagerly(tiny, tmp_path, capsys):
    # --backend none compiles nothing: no check against itself, no compile announced, nothing fused
    import json

    model_dir, data = tiny
    result = _run(["--model", str(model_dir), "--data", str(data), "--steps", "2", "--backend", "none",
                   "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert result["fused"] == 0 and all(np.isfinite(result["losses"]))
    assert "vision encoder eager (--backend none: nothing compiled)" in out
    assert "check: none, --backend none compiles nothing (the run is the eager baseline)" in out
    assert "compiling" not in out and "check: eager loss" not in out
    assert "attention blocks fused by samhq: 0 (vision encoder has 2 attention layers; --backend none: nothing " \
           "compiled)" in out
    assert json.loads((tmp_path / "summary.json").read_text())["check_abs_diff"] is None


def test_eager_baseline_is_timed_without_changing_the_run(tiny, tmp_path, capsys):
    # the check times forward + backward of the first batch eagerly and compiled; no weight moves, so the run's
    # losses are those of a run without it (LoRA: gradients reach the encoder's adapters too)
    import json

    model_dir, data = tiny
    common = ["--model", str(model_dir), "--data", str(data), "--train", "lora", "--steps", "2", "--eval-every", "2"]
    timed = _run(common + ["--out", str(tmp_path / "timed"), "--baseline-steps", "2"])
    out = capsys.readouterr().out
    plain = _run(common + ["--out", str(tmp_path / "plain"), "--no-check"])
    assert timed["losses"] == plain["losses"] and timed["fused"] == 2
    summary = json.loads((tmp_path / "timed" / "summary.json").read_text())
    eager, compiled = summary["first_batch_eager_ms"], summary["first_batch_compiled_ms"]
    assert eager > 0 and compiled > 0
    assert (f"first batch, forward + backward, median of 2 (no optimizer step): eager {eager:.1f} ms/step, samhq "
            f"{compiled:.1f} ms/step\n") in out  # no speed ratio on CPU
    assert ("note: on CPU samhq is checked for correctness, not speed: its fused kernels need a CUDA GPU (on CPU the "
            "fused op runs a blocked PyTorch reference)") in out
    assert json.loads((tmp_path / "plain" / "summary.json").read_text())["first_batch_eager_ms"] is None
    with pytest.raises(SystemExit):
        finetune_samhq.main(["--baseline-steps", "-1", "--out", str(tmp_path / "bad")])
    assert "--baseline-steps must be 0 or more, got -1" in capsys.readouterr().err
