"""See what the samhq backend did to one SAM-HQ attention layer: graph dumps and the match report.

    python examples/dump_graphs.py                 # writes ./samhq_dumps/ and prints the report
    python examples/dump_graphs.py --attn eager --output-attentions   # a case left alone, and why

The same dumps come from any model with `SAMHQ_FX_DUMP_DIR=dir` or
`torch.compile(model, backend="samhq", options={"samhq.dump_dir": "dir"})`; `TORCH_LOGS="+samhq_fx"`
logs one summary line per compiled graph and the reason for every candidate left alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers.models.sam_hq.modeling_sam_hq import SAM_HQ_VISION_ATTENTION_CLASSES

from samhq_fx.models import random_init_, tiny_vision_config


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa", help="HF attn_implementation")
    p.add_argument("--output-attentions", action="store_true", help="also return the probabilities (not fusable)")
    p.add_argument("--dump-dir", default="samhq_dumps")
    args = p.parse_args(argv)

    cfg = tiny_vision_config(args.attn)
    layer = random_init_(SAM_HQ_VISION_ATTENTION_CLASSES[args.attn](cfg, window_size=3))
    # the attention layer returns (output, probabilities); keep the probabilities only if asked
    fn = (lambda x: layer(x)) if args.output_attentions else (lambda x: layer(x)[0])
    compiled = torch.compile(fn, backend="samhq", options={"samhq.dump_dir": args.dump_dir})
    compiled(torch.randn(2, 3, 3, cfg.hidden_size))  # 2 windows of 3x3 tokens

    out = Path(args.dump_dir)
    report = sorted(out.glob("graph_*_report.txt"))[-1]
    print(f"wrote {sorted(p.name for p in out.iterdir())} to {out}/\n")
    print(report.read_text())
    after = report.with_name(report.name.replace("report.txt", "after.py")).read_text()
    fused = [l.strip() for l in after.splitlines() if "samhq.rel_pos_attention" in l and not l.strip().startswith("#")]
    print("fused call in the rewritten graph:" if fused else "no fused call in the rewritten graph")
    for line in fused:
        print("   ", line[:160])


if __name__ == "__main__":
    main()
