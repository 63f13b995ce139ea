"""Seeing what the backend did: graph dumps before/after the rewrite and a match report.

Turn on with `options={"samhq.dump_dir": "some/dir"}` or `SAMHQ_FX_DUMP_DIR=some/dir`. Per
compiled graph N it writes
    graph_N_before.py   the Dynamo graph as Inductor received it (readable Python)
    graph_N_after.py    the same graph after the rewrite
    graph_N_report.txt  every candidate (softmax / SDPA), matched or not, and why not
A one-line summary per graph goes to logging.getLogger("samhq_fx") (`TORCH_LOGS="+samhq_fx"`).

`cudagraph_skips()` says whether CUDA graphs (mode "reduce-overhead") really captured what was compiled
inside it: Inductor falls back to running a graph without them, with only a warning, when it finds a
reason (a CPU tensor, a mutated input, a dynamic shape, ...).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from torch.fx import Graph

log = logging.getLogger("samhq_fx")


@dataclass
class CudagraphSkips:
    count: int = 0                                     # graphs compiled without CUDA graphs
    reasons: list[str] = field(default_factory=list)   # Inductor's "skipping cudagraphs due to ..." lines


@contextlib.contextmanager
def cudagraph_skips():
    """Count the graphs that Inductor compiled without CUDA graphs in this block, with the reasons.

        with cudagraph_skips() as skips:
            step()                       # compiles with mode="reduce-overhead"
        assert skips.count == 0, skips.reasons

    Reads counters["inductor"]["cudagraph_skips"], which torch bumps for every skip, and the warnings of its
    "cudagraphs" log artifact (torch/_inductor/cudagraph_utils.py, log_cudagraph_skip_and_bump_counter; a
    non-CUDA graph is counted without a line). Each reason is also logged to the samhq_fx logger."""
    from torch._dynamo.utils import counters
    from torch._inductor import cudagraph_utils

    out = CudagraphSkips()

    class _Grab(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if "skipping cudagraphs" in msg:
                out.reasons.append(msg)
                log.warning("samhq_fx: %s", msg)

    handler = _Grab(logging.WARNING)
    # the "cudagraphs" artifact logger; older torch wrote these lines to perf_hint_log (off by default)
    loggers = [lg for lg in (getattr(cudagraph_utils, n, None) for n in ("cudagraphs_log", "perf_hint_log")) if lg]
    start = counters["inductor"]["cudagraph_skips"]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield out
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        out.count = counters["inductor"]["cudagraph_skips"] - start


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
                f"-> replaces {m.output.name}" + (f", heads-last ({c.heads} heads)" if c.heads > 1 else "")
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
