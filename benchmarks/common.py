"""Shared helpers for the benchmark scripts (train_step.py, inference.py, sol076/compare_impls.py, sol076/time_entry.py).

What lives here, once:
  * environment/version info for the JSON header (`env_info`);
  * the cold-L2 flush (`L2Flusher`): before each timed call write a buffer of 2x the GPU's L2 size, then
    synchronize, so every call starts from an idle GPU with nothing useful in L2;
  * the kernel-span measurement (`kernel_spans`): one torch.profiler (CUPTI) session over many calls; each
    call is bracketed on the GPU stream by two tiny marker kernels (`torch.cuda._sleep`, kernel name
    `spin_kernel`, which no implementation launches), so the GPU records of call i are exactly those
    between its two markers.  The flush runs before the opening marker, so it is never inside a span.
    span = last end - first start of those records (kernels, memcpy and memset);
  * wall time per call from CUDA events (`wall_times`), or perf_counter on CPU;
  * the time budget (`Budget`) and a plain-text table;
  * the results rows: every harness appends one JSON object per measurement to benchmarks/results/<harness>.jsonl
    (or to its --out), each carrying `row_meta` (the commit, the date, the GPU and the torch / triton /
    transformers versions it ran with) (`results_path`, `append_rows`, `load_rows`);
  * several GPUs of one host (`--gpus N`, `run_on_gpus`): the cells are split by estimated cost into N
    shares, each timed serially by its own process pinned to one GPU (CUDA_VISIBLE_DEVICES), and the rows
    merged. Compiling is CPU-bound and single-threaded per process, so N GPUs give ~N times the cells per
    hour (2026-11-30: two H200s of one host, one precision each, ~116 cells per GPU in ~18 minutes).
    Warming the compile caches in many parallel processes first was tried and lost: 24 processes on 32
    cores all ran out of time (benchmarks/DECISIONS.md).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Iterable, Sequence

import torch

MARKER_NAME = "spin_kernel"  # torch.cuda._sleep's kernel: our call separator in profiler traces
DONE_STATUSES = ("PASS", "FAIL", "ERROR", "OK")  # rows that --resume treats as done


def log(msg: str, t0: float | None = None) -> None:
    """Progress line, flushed at once (the GPU window's output is read as it streams)."""
    prefix = f"[{time.perf_counter() - t0:7.1f}s] " if t0 is not None else ""
    print(prefix + msg, flush=True)


def env_info() -> dict:
    """GPU name and library versions for the JSON header."""
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": "cpu",
    }
    for mod in ("triton", "transformers"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # not installed: say so rather than fail
            info[mod] = None
    try:
        from importlib.metadata import version

        info["samhq_fx"] = version("samhq-fx")
    except Exception:
        info["samhq_fx"] = None
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        info["git"] = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=here, capture_output=True, text=True, timeout=5
        ).stdout.strip() or None
    except Exception:
        info["git"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1),
                    l2_cache_bytes=getattr(p, "L2_cache_size", None), sm_count=p.multi_processor_count)
    return info


# the harnesses' dtypes (train_step.py, inference.py, tools/layer_peers.py), in their table order: torch's fp32 matmul
# precision for each ("fp32" is PyTorch's default, true fp32 GEMMs), and the relative difference from the reference
# build over which a run fails: past rounding (recorded: bf16 to 0.053, TF32 to 0.0058, fp32 to 7.4e-5)
DTYPE_PRECISION = {"tf32": "high", "bf16": "high", "fp32": "highest"}
DTYPE_TOL = {"tf32": 1e-2, "bf16": 1e-1, "fp32": 1e-3}


def set_precision(precision: str) -> None:
    """float32 matmul precision: 'highest' (true fp32), 'high' (TF32), 'medium' (TF32 on CUDA too)."""
    torch.set_float32_matmul_precision(precision)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class L2Flusher:
    """Evicts L2 by writing a buffer twice its size; no-op on CPU.  H200 L2 is 60 MB, read from the device."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.buf = None
        self.nbytes = 0
        if device.type == "cuda" and enabled:
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 60 * 2**20
            self.nbytes = 2 * l2
            self.buf = torch.empty(self.nbytes, dtype=torch.int8, device=device)

    def __call__(self) -> None:
        if self.buf is not None:
            self.buf.zero_()


def marker() -> None:
    # ~1 us spin kernel, a unique name in the trace that separates calls.
    torch.cuda._sleep(1)


def median(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def wall_times(call: Callable[[int], object], iters: int, device: torch.device,
               flush: Callable[[], None] | None = None, before: Callable[[], None] | None = None) -> list[float]:
    """Per-call wall time in microseconds.  call(i) runs call number i (it picks its own input set).

    CUDA: flush L2, synchronize (idle GPU), then CUDA events recorded right before and after the call, so
    the flush is outside and CPU launch gaps inside.  CPU: perf_counter around the call.
    """
    out = []
    if device.type != "cuda":
        for i in range(iters):
            if before:
                before()
            t = time.perf_counter()
            call(i)
            out.append((time.perf_counter() - t) * 1e6)
        return out
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for i, (start, end) in enumerate(events):
        if flush:
            flush()
        torch.cuda.synchronize(device)
        if before:
            before()
        start.record()
        call(i)
        end.record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) * 1e3 for s, e in events]


ROTATE_ROUNDS = 3


def in_turn(keys: list, i: int) -> list:
    """keys in turn i's order: each turn starts one key later, so no key always runs first."""
    return keys[i % len(keys):] + keys[:i % len(keys)]


def rotate_timings(kept: dict, iters: int, device: torch.device, rounds: int = ROTATE_ROUNDS) -> dict | None:
    """Per kept cell, the median ms of `iters` calls in each of `rounds` rounds, the cells' calls interleaved one
    by one, the order rotated every turn (kept: key -> (call, before) as wall_times takes them). In one process the
    first build timed ran slower on the host in every piece, and a lent host's speed drifted by up to 1.7x between
    rounds of 20 calls (H200, benchmarks/DECISIONS.md): cells timed one after the other are
    charged whatever the host did meanwhile, interleaved calls share it. None if a call compiled again (its rounds
    would have timed a compile)."""
    from torch._dynamo.utils import counters

    graphs0 = counters["stats"]["unique_graphs"]
    keys = list(kept)
    by_round: dict = {key: [] for key in keys}
    for _ in range(rounds):
        times: dict = {key: [] for key in keys}
        for i in range(iters):
            for key in in_turn(keys, i):
                call, before = kept[key]
                times[key] += wall_times(lambda _j, call=call, i=i: call(i), 1, device, before=before)
        for key in keys:
            by_round[key].append(median(times[key]) / 1e3)
    if counters["stats"]["unique_graphs"] != graphs0:
        log("rotation: a kept cell compiled again; its in-cell timing stands")
        return None
    return by_round


def recompile_limit_patch(at_least: int = 64):
    """torch._dynamo.config.patch raising the per-code cache limit: cells kept alive together are entries of the
    same compiled function (recompile_limit in newer torch, cache_size_limit before)."""
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    return cfg.patch(**{name: max(at_least, getattr(cfg, name))})


def _ns(e, what: str) -> float:
    """Kineto event time in ns across torch versions (start_ns/end_ns, else start_us/duration_us)."""
    if what == "start":
        return e.start_ns() if hasattr(e, "start_ns") else e.start_us() * 1e3
    if hasattr(e, "end_ns"):
        return e.end_ns()
    if hasattr(e, "duration_ns"):
        return e.start_ns() + e.duration_ns()
    return (e.start_us() + e.duration_us()) * 1e3


def gpu_records(prof) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of every GPU activity record (kernel/memcpy/memset) of a finished profile,
    sorted by start.  Reads the raw Kineto events (no FunctionEvent tree building, which is slow)."""
    recs = []
    cuda_t = torch.autograd.DeviceType.CUDA
    kineto = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if kineto is not None:
        for e in kineto.events():
            if e.device_type() == cuda_t and not getattr(e, "is_user_annotation", lambda: False)():
                recs.append((e.name(), _ns(e, "start") / 1e3, _ns(e, "end") / 1e3))
    else:  # other builds: the parsed FunctionEvents carry the same records
        for e in prof.events():
            if e.device_type == cuda_t and not getattr(e, "is_user_annotation", False):
                recs.append((e.name, e.time_range.start, e.time_range.end))
    recs.sort(key=lambda r: r[1])
    return recs


def split_calls(recs: list[tuple[str, float, float]], iters: int, starts: bool = False):
    """Cut a sorted record list at the marker kernels: call i lies between markers 2i and 2i+1 (each call is
    bracketed by its own pair, so the next call's flush falls between pairs).  Returns (spans_us, kernels),
    one entry per call: kernels as (name, duration_us), or with starts=True (name, duration_us, start_us) with
    start_us from the call's first record, so the idle gaps of a call can be placed.  CUPTI can drop the first
    records of a session; then markers are paired from the end (a dropped prefix leaves the later calls intact)
    and the calls without both markers get None."""
    cuts = [k for k, r in enumerate(recs) if MARKER_NAME in r[0]]
    if len(cuts) != 2 * iters:
        log(f"    warning: expected {2 * iters} marker kernels in the trace, found {len(cuts)}"
            + ("; pairing from the end" if cuts else "; no spans"))
    cuts = cuts[len(cuts) % 2:][-2 * iters:]  # an odd count: the first survivor is an orphan end marker
    missing = iters - len(cuts) // 2
    spans: list[float | None] = [None] * missing
    kernels: list[list[tuple[str, float]]] = [[] for _ in range(missing)]
    for a, b in zip(cuts[0::2], cuts[1::2]):
        inside = recs[a + 1:b]
        t0 = min((r[1] for r in inside), default=0.0)
        spans.append(max(r[2] for r in inside) - t0 if inside else None)
        kernels.append([(r[0], r[2] - r[1], r[1] - t0) if starts else (r[0], r[2] - r[1]) for r in inside])
    return spans, kernels


def marker_gaps(recs: list[tuple[str, float, float]], iters: int) -> list[float | None]:
    """Per call, the GPU time from the end of its opening marker to the start of its closing one (us): the
    call's wall time as the GPU saw it, idle gaps included (the host launches the opening marker, then the
    call at once).  Paired from the end like split_calls."""
    cuts = [k for k, r in enumerate(recs) if MARKER_NAME in r[0]]
    cuts = cuts[len(cuts) % 2:][-2 * iters:]
    gaps: list[float | None] = [None] * (iters - len(cuts) // 2)
    gaps += [recs[b][1] - recs[a][2] for a, b in zip(cuts[0::2], cuts[1::2])]
    return gaps


def busy_share(kernels: list[tuple[str, float]], wall_us: float | None) -> float | None:
    """GPU-busy share of one call: the sum of its GPU records' durations / its wall time (kernels of one
    stream do not overlap, so this is the fraction of the call the GPU was working)."""
    if not kernels or not wall_us:
        return None
    return sum(d for _, d in kernels) / wall_us


def host_gpu_ms(kernels: list[tuple[str, float]], wall_ms: float | None) -> dict:
    """{"gpu_ms": the sum of one profiled call's GPU record durations (ms), "host_ms": `wall_ms` (the cell's
    median wall time) minus that, clipped at 0}: the part of a call the GPU did not account for, i.e. host time
    it waited for (launches, Python, guards).  Both None without records (CPU, --no-profile)."""
    if not kernels:
        return {"gpu_ms": None, "host_ms": None}
    gpu = sum(k[1] for k in kernels) / 1e3
    return {"gpu_ms": round(gpu, 3), "host_ms": None if wall_ms is None else round(max(0.0, wall_ms - gpu), 3)}


def kernel_spans(call: Callable[[int], object], iters: int, device: torch.device,
                 flush: Callable[[], None] | None = None, before: Callable[[], None] | None = None,
                 walls: bool = False, starts: bool = False):
    """Per-call GPU span (us) from CUPTI records, and the per-call kernel list [(name, duration_us)] (with
    starts=True [(name, duration_us, start_us)], split_calls); with walls=True also the per-call marker gaps
    (marker_gaps), as a third list.

    GPU stream per call:  [flush] sync [marker] <call's kernels> [marker] sync.  A span is the first start to
    the last end of the records between the call's two markers.  Returns empty lists on CPU.
    """
    if device.type != "cuda":
        return ([], [], []) if walls else ([], [])
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            if flush:
                flush()
            torch.cuda.synchronize(device)
            if before:
                before()
            marker()
            call(i)
            marker()  # stream-ordered after the call's last kernel, including the autograd backward's
            torch.cuda.synchronize(device)
    recs = gpu_records(prof)
    spans, kernels = split_calls(recs, iters, starts)
    return (spans, kernels, marker_gaps(recs, iters)) if walls else (spans, kernels)


def check_profiler(device: torch.device) -> bool:
    """Start CUPTI once before any CUDA graph is captured (a profiler first attached after capture can break
    replays), and verify that the marker scheme sees kernels.  Runs a small non-empty session."""
    if device.type != "cuda":
        return False
    x = torch.ones(1024, device=device)
    spans, _ = kernel_spans(lambda i: x.add_(1), 2, device)
    ok = len(spans) == 2 and all(s is not None for s in spans)
    if not ok:
        log("warning: profiler self-test saw no kernels; spans will be missing (wall times still reported)")
    return ok


class Budget:
    """Wall-clock budget for the whole run.  fits(kind) says whether a unit of work of that kind can still
    start and end in time; its estimate is the longest observed duration of that kind (a prior before)."""

    def __init__(self, seconds: float | None, priors: dict[str, float] | None = None):
        self.t0 = time.perf_counter()
        self.seconds = seconds
        self.est: dict[str, float] = dict(priors or {})
        self.seen: set[str] = set()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def fits(self, kind: str) -> bool:
        if not self.seconds:
            return True
        return self.elapsed() + self.est.get(kind, 0.0) <= self.seconds

    def record(self, kind: str, seconds: float) -> None:
        # the first measurement replaces the prior; later ones only raise it (bigger shapes compile longer)
        self.est[kind] = max(seconds, self.est[kind]) if kind in self.seen else seconds
        self.seen.add(kind)


RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
META = ("commit", "date", "gpu", "torch", "triton", "transformers")  # what row_meta gives every row, in this order


def row_meta(env: dict, device: torch.device) -> dict:
    """The fields every results row starts with: the commit the run timed (git describe, "-dirty" with local
    changes), the run's start (UTC), the GPU (None on CPU), the library versions, and the GPU class whose configs
    the kernels took where SAMHQ_FX_ARCH emulates another one on this GPU (kernels/arch.py). env: env_info()."""
    row = {"commit": env.get("git"), "date": env.get("date"), "gpu": env["device"] if device.type == "cuda" else None,
           "torch": env.get("torch"), "triton": env.get("triton"), "transformers": env.get("transformers")}
    from samhq_fx.kernels import arch  # the one reader of SAMHQ_FX_ARCH (an unknown name is a ValueError)

    emulated = arch.emulated()
    if emulated is not None:
        row["emulated_arch"] = emulated.name
    return row


def results_path(harness: str, out: str | None, default: bool = True) -> str | None:
    """Where a harness appends its rows: --out (a .jsonl file, else a directory: <dir>/<harness>.jsonl), else
    benchmarks/results/<harness>.jsonl; None when there is no --out and `default` is off (a --quick run)."""
    if out:
        return out if out.endswith(".jsonl") else os.path.join(out, harness + ".jsonl")
    return os.path.join(RESULTS_DIR, harness + ".jsonl") if default else None


def append_rows(path: str | None, rows: Iterable[dict]) -> None:
    """Append rows to a JSONL file, one JSON object a line, flushed at once (a run stopped later keeps them)."""
    rows = list(rows)
    if not path or not rows:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        f.write("".join(json.dumps(r, default=str) + "\n" for r in rows))


def load_rows(path: str | None) -> list[dict]:
    """The rows of a results JSONL (for --resume, and what --gpus' processes wrote); [] if there is none."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def add_run_args(ap, harness: str, budget: float = 480.0, resume: bool = True, profile: str | None = None,
                 chart: str | None = None) -> None:
    """--out, --time-budget, --device, and where the runner has them --resume / --no-profile / --no-chart: the
    flags the runners share. profile: what --no-profile skips; chart: the charts it draws (beside its rows)."""
    ap.add_argument("--out", default=None,
                    help=f"append the rows to this .jsonl file (a directory: <dir>/{harness}.jsonl) instead of "
                         f"benchmarks/results/{harness}.jsonl; --quick writes rows only here")
    if resume:
        ap.add_argument("--resume", default=None, help="an earlier results .jsonl (e.g. a cut run's --out): its "
                                                       "finished cells are not run again")
    ap.add_argument("--time-budget", type=float, default=budget,
                    help="seconds; cells that would not finish in time are skipped (listed; use --resume). 0 = none")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    if profile:
        ap.add_argument("--no-profile", dest="profile", action="store_false", help=f"skip {profile}")
    if chart:
        ap.add_argument("--no-chart", dest="chart", action="store_false", help=f"do not draw {chart}")


def pick_device(name: str | None) -> torch.device:
    """--device, or CUDA when there is one."""
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def warm_libraries(device) -> None:
    """Allocate what cuBLAS / cuBLASLt keep once they have run (a workspace per handle and stream, in the caching
    allocator: the main thread's for the forward, the autograd engine's for the backward; fp32 and bf16)."""
    lin = torch.nn.Linear(64, 64, device=device)
    x = torch.randn(16, 64, device=device)
    for bf16 in (False, True):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            y = lin(x)
        y.float().sum().backward()
    torch.cuda.synchronize(device)


def start_run(args, priors: dict) -> tuple[torch.device, "Budget", dict, dict]:
    """A runner's start: its device (on CUDA with cuBLAS's workspaces allocated: warm_libraries), its time budget
    (priors: estimated seconds per cell kind), --gpus checked against the GPUs there are (where the runner has
    --gpus), the environment (for its log line) and the metadata its rows start with (row_meta)."""
    device = pick_device(args.device)
    budget = Budget(args.time_budget, priors)
    if hasattr(args, "gpus"):
        args.gpus = usable_gpus(args.gpus, device, budget.t0)
    if device.type == "cuda":
        warm_libraries(device)  # so that no implementation's peak carries cuBLAS's workspaces: the first one's did
    env = env_info()
    return device, budget, env, row_meta(env, device)


def add_cell_args(ap, cell_form: str) -> None:
    """--gpus / --cells, shared by the benchmark scripts (cell_form: 'a/b/c')."""
    ap.add_argument("--gpus", type=int, default=1,
                    help="time on this many GPUs of this host at once: one process per GPU, each with a share of "
                         "the cells (split by estimated cost), rows merged into one results file")
    ap.add_argument("--cells", default=None,
                    help=f"only these cells, '{cell_form};...' (what --gpus hands each process)")


def parse_cells(ap, spec: str | None, cell_form: str) -> tuple[list[tuple[str, str, str]], list[str]] | None:
    """--cells 'a/b/c;...' -> (cells, [comma list of the a's, of the b's, of the c's]); None without it."""
    if not spec:
        return None
    cells = [tuple(c.split("/")) for c in spec.split(";") if c]
    if not cells or any(len(c) != 3 for c in cells):
        ap.error(f"--cells wants '{cell_form}' items separated by ';'")
    return cells, [",".join(dict.fromkeys(c[i] for c in cells)) for i in range(3)]


def shard(cells: Sequence[str], cost: Callable[[str], float], n: int) -> list[list[str]]:
    """Split cells into at most n shards of about equal total cost (greedy, most expensive first)."""
    shards: list[list[str]] = [[] for _ in range(max(1, n))]
    load = [0.0] * len(shards)
    for c in sorted(cells, key=cost, reverse=True):
        k = load.index(min(load))
        shards[k].append(c)
        load[k] += cost(c)
    return [s for s in shards if s]


def shard_groups(cells: Sequence[str], cost: Callable[[str], float], n: int,
                 group: Callable[[str], str]) -> list[list[str]]:
    """shard(), keeping cells with the same group(cell) together (e.g. one workload's reference data is built
    once per process); cells keep their order inside a shard."""
    groups: dict[str, list[str]] = {}
    for c in cells:
        groups.setdefault(group(c), []).append(c)
    shards = shard(list(groups), lambda g: sum(map(cost, groups[g])), n)
    return [[c for g in sorted(s, key=list(groups).index) for c in groups[g]] for s in shards]


def usable_gpus(requested: int, device: torch.device, t0: float | None = None) -> int:
    """--gpus, capped at the GPUs this process can see (1 on CPU), with a line saying so when capped."""
    have = torch.cuda.device_count() if device.type == "cuda" else 1
    if requested > have:
        log(f"--gpus {requested}: only {have} {'GPU' if device.type == 'cuda' else 'device (CPU)'} visible; using {have}", t0)
    return max(1, min(requested, have))


def run_on_gpus(script: str, shards: list[list[str]], extra_args: Sequence[str], timeout: float | None,
                t0: float | None = None) -> list[dict]:
    """Run `script --cells <shard k> --out <tmp>/gpu<k>.jsonl *extra_args` on the k-th visible GPU, all shards at
    once, and return the union of the rows they wrote. Their progress lines go to this process's stdout.

    Each process appends its rows as it finishes them, so a process that fails or is stopped at `timeout` seconds
    still contributes the cells it finished; the caller reports the rest as not run."""
    import tempfile

    tmp = tempfile.mkdtemp(prefix=os.path.splitext(os.path.basename(script))[0] + "_gpus_")
    # the k-th GPU this process sees: honour a CUDA_VISIBLE_DEVICES the run was started with
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    ids = visible or [str(k) for k in range(len(shards))]
    procs = []
    for k, cells in enumerate(shards):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=ids[k])
        cmd = [sys.executable, script, "--cells", ";".join(cells), "--out", os.path.join(tmp, f"gpu{k}.jsonl"), *extra_args]
        # same session as this process: whoever stops this run (a job's timeout, a machine's cleanup) stops them too
        procs.append(subprocess.Popen(cmd, env=env))
    log(f"{sum(map(len, shards))} cells on {len(shards)} GPUs: " + ", ".join(f"GPU {k}: {len(s)}" for k, s in enumerate(shards)), t0)
    deadline = None if timeout is None else time.perf_counter() + timeout
    rows: list[dict] = []
    for k, proc in enumerate(procs):
        try:
            rc = proc.wait(timeout=None if deadline is None else max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = "timeout"
        if rc != 0:
            log(f"GPU {k}'s process ended with {rc}; its finished cells are kept", t0)
        rows += load_rows(os.path.join(tmp, f"gpu{k}.jsonl"))
    return rows


def fmt(x, spec: str = ".1f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    rows = [list(map(str, r)) for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(c.rjust(w) if c[:1].isdigit() or c[:1] == "-" else c.ljust(w) for c, w in zip(r, widths)))
    sys.stdout.flush()


def eager_reference(rows: list[dict], row: dict, group: Sequence[str], key: str) -> dict | None:
    """The row the correctness checks compare `row` against: eager-eager's of its group (the same values of `group`)
    that has `key`, else eager-sdpa's; None without either."""
    same = [q for q in rows if all(q[g] == row[g] for g in group) and q.get(key) is not None]
    return next((q for name in ("eager-eager", "eager-sdpa") for q in same if q["impl"] == name), None)


def samhq_fused_count() -> int:
    """Attention subgraphs the samhq backend rewrote since the last reset (missing counter -> 0)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["samhq"].get("fused", 0))
    except Exception:
        return 0


def reset_compile_state() -> None:
    """Fresh dynamo state per cell: every cell compiles the same Python function, and dynamo's per-code
    cache (recompile limit 8) would otherwise fill up and silently fall back to eager.  Also clears
    cudagraph trees and the samhq counter."""
    import gc

    torch._dynamo.reset()
    try:
        from torch._dynamo.utils import counters

        counters["samhq"].clear()
    except Exception:
        pass
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def samhq_available() -> bool:
    """True when `backend="samhq"` resolves (entry point registered and importable)."""
    try:
        from torch._dynamo.backends.registry import lookup_backend

        lookup_backend("samhq")
        return True
    except Exception:
        return False
