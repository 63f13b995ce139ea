"""Seeing what the backend did: graph dumps before/after the rewrite and a match report.

Turn on with `options={"samhq.dump_dir": "some/dir"}` or `SAMHQ_FX_DUMP_DIR=some/dir`. Per
compiled graph N it writes
    graph_N_before.py   the Dynamo graph as Inductor received it (readable Python)
    graph_N_after.py    the same graph after the rewrite
    graph_N_report.txt  every candidate (softmax / SDPA), matched or not, and why not
A one-line summary per graph goes to logging.getLogger("samhq_fx") (`TORCH_LOGS="+samhq_fx"`).
"""

from __future__ import annotations

from pathlib import Path

from torch.fx import Graph


def graph_source(graph: Graph) -> str:
    gm = graph.owning_module
    if gm is not None and hasattr(gm, "print_readable"):
        try:
            return gm.print_readable(print_output=False)
        except Exception:  # print_readable can trip on exotic meta; the plain code always works
            pass
    return graph.python_code(root_module="self").src


def format_report(candidates) -> str:
    fused = [c for c in candidates if c.match is not None]
    lines = [f"{len(fused)} of {len(candidates)} attention candidates fused", ""]
    for c in candidates:
        if c.match is not None:
            m = c.match
            lines.append(
                f"FUSED   {c.node.name} ({c.kind}): q={m.q.name} k={m.k.name} v={m.v.name} "
                f"grid={m.grid[0]}x{m.grid[1]} scale={m.scale:.6g} "
                f"rel_h={[t.node.name for t in m.rel_h]} rel_w={[t.node.name for t in m.rel_w]} "
                f"-> replaces {m.output.name}"
            )
        else:
            lines.append(f"SKIPPED {c.node.name} ({c.kind}): {c.reason}")
    return "\n".join(lines) + "\n"


def write_dump(dump_dir: str, index: int, before: str, after: str, candidates) -> None:
    out = Path(dump_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"graph_{index}_before.py").write_text(before)
    (out / f"graph_{index}_after.py").write_text(after)
    (out / f"graph_{index}_report.txt").write_text(format_report(candidates))
