"""Does every kernel launch of one rel-pos attention shape build and fit on a GPU architecture? Asked without one.

The host functions (rel_pos_attention.forward / backward) run on meta tensors with their launches recorded, and each
recorded launch is compiled by Triton for the architecture's target (Triton ships ptxas, so a CPU machine can build
for sm_80 to sm_120). A launch fits when it compiles, asks for no more shared memory than one CTA may have there and,
on sm_100, no more tensor-memory columns than an SM has. The rewrite asks this at compile time, on the device it
compiles for, and leaves an attention it cannot fuse to Inductor (as it does one the config table's "place" rows
give Inductor, `left_to_inductor`, asked first); `python tests/cross_compile.py` prints the same
facts (shared memory, registers, spills, CTAs per SM) as a table for every architecture and SAM shape.

    # q: [B, Nq, D]   k, v: [B, Nk, D]   rel_h: [B, Nq, Hk]   rel_w: [B, Nq, Wk]
    fit.misfit(arch.ARCHS["sm_86"], torch.float32, "highest", Shape(b=12, n_q=4096, hk=64, wk=64, d=64, dv=64))
    -> None, or why not ("backward dq needs 176 KB of shared memory, sm_80 has 163 KB")

Compiles are typed as Inductor types user kernels (Python floats as fp64 scalars, ints equal to 1 as constants), the
way the triton_op registration is compiled; Triton's disk cache keeps each binary, and this module's own cache keeps
each verdict for the life of the process.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import triton

from . import arch, configs, tiles
from . import rel_pos_attention as K


@dataclass(frozen=True)
class Shape:
    """One fused attention's sizes: b = batch * heads (None: any, as with a dynamic batch), queries, key grid, head
    dims; hq: the rel-pos terms come as [B, Hq, Wq, K] (the query grid as two dims, hq rows); heads: the output is
    written heads-last, [b // heads, N, heads, Dv] (the rewrite's choice where the model reads it so), where above 1."""
    b: int | None
    n_q: int
    hk: int
    wk: int
    d: int
    dv: int
    hq: int = 0
    heads: int = 1


@dataclass(frozen=True)
class Launch:
    """One recorded kernel launch: what decides its binary."""
    kernel: str  # "fwd", or "bwd:dq" / "bwd:dkdv" / "bwd:both"
    signature: tuple  # ((name, type), ...) of the runtime arguments
    constexprs: tuple  # ((name, value), ...)
    options: tuple  # ((num_warps, n), (num_stages, n))
    aligned: tuple = ()  # names of the arguments divisible by 16 (pointers, and ints that are multiples of 16)
    fn: object = field(default=None, compare=False, hash=False, repr=False)  # the @triton.jit function


@dataclass(frozen=True)
class Built:
    """What one launch costs on one architecture."""
    launch: Launch
    arch: arch.Arch
    shared: int = 0  # bytes of shared memory a CTA asks for
    registers: int = 0  # per thread
    spills: int = 0  # bytes spilled per thread
    tmem: int = 0  # tensor-memory columns (sm_100), where Triton reports them
    error: str | None = None  # the compile error, if it did not build

    @property
    def misfit(self) -> str | None:
        """None if the launch runs there; else why not, in a sentence."""
        if self.error:
            return f"{self.launch.kernel} does not build for {self.arch.name}: {self.error}"
        if self.shared > self.arch.smem:
            return (f"{self.launch.kernel} needs {self.shared // 1024} KB of shared memory, {self.arch.name} has "
                    f"{self.arch.smem // 1024} KB")
        if self.tmem > TMEM_COLUMNS:
            return (f"{self.launch.kernel} needs {self.tmem} tensor-memory columns, {self.arch.name} has "
                    f"{TMEM_COLUMNS}")
        return None

    @property
    def warps(self) -> int:
        return dict(self.launch.options).get("num_warps", 4)

    @property
    def ctas_per_sm(self) -> int:
        """CTAs of this launch one SM holds at once: the least of what its registers, shared memory and warps allow
        (0 where it does not build or fit)."""
        if self.misfit:
            return 0
        sm = per_sm(self.arch)
        regs = -(-max(self.registers, 1) // 8) * 8 * 32 * self.warps  # allocated per warp in units of 8 per thread
        return min(sm.registers // regs, sm.smem // (self.shared + sm.cta_reserved), sm.warps // self.warps)


@dataclass(frozen=True)
class PerSM:
    """What one SM holds: registers, shared memory in bytes (each CTA costs cta_reserved more than it asks for, and
    the per-CTA maximum, arch.Arch.smem, is the SM's less that), resident warps (CUDA programming guide)."""
    registers: int
    smem: int
    warps: int
    cta_reserved: int = 1024


TMEM_COLUMNS = 512  # tensor memory per SM on sm_100 (128 lanes x 512 32-bit columns)


def per_sm(target: arch.Arch) -> PerSM:
    """The per-SM limits of `target`: 48 resident warps on sm_86 / sm_87 / sm_89 / sm_120, 64 elsewhere."""
    warps = 48 if target.capability in (86, 87, 89) or target.capability >= 120 else 64
    return PerSM(65536, target.smem + 1024, warps)


_PTR = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}
_lock = threading.Lock()  # recording swaps the host code's launcher
_built: dict[tuple, Built] = {}
_verdicts: dict[tuple, tuple[list, str | None]] = {}  # -> (the table it was decided under, the verdict)


def _record(kernel, grid, *args, **kwargs):
    names = [p.name for p in kernel.params]
    sig, consts, aligned = [], [], []
    for name, val in zip(names, args):
        if isinstance(val, torch.Tensor):
            sig.append((name, _PTR[val.dtype]))
            aligned.append(name)  # fresh allocations and the host's copies start 16-byte aligned
        elif isinstance(val, float):
            sig.append((name, "fp64"))  # what Inductor's user-kernel codegen declares for Python floats
        elif val == 1:
            consts.append((name, 1))
        else:
            sig.append((name, "i32"))
            if val % 16 == 0:
                aligned.append(name)  # as Triton's launcher and Inductor specialize them: tt.divisibility 16
    options = tuple((k, kwargs[k]) for k in ("num_warps", "num_stages") if k in kwargs)
    consts += [(n, kwargs[n]) for n in names[len(args):] if n in kwargs]
    part = dict(consts).get("PART")
    label = kernel.__name__.strip("_").removesuffix("_kernel") + (f":{part}" if part else "")
    _recorded.append(Launch(label, tuple(sig), tuple(consts), options, tuple(aligned), kernel))


_recorded: list[Launch] = []


def launches(target: arch.Arch, dtype: torch.dtype, precision: str, shape: Shape) -> list[Launch]:
    """Every launch forward + backward make for `shape` on `target` (precision: torch's fp32 matmul setting).
    With b None, the launches of every batch size: the configs change with rows only at the table's thresholds."""
    batches = _batch_sizes(shape)
    found: dict[Launch, None] = {}
    with _lock, _matmul_precision(precision), arch.assume(target):
        saved = K._launch
        K._launch = _record
        try:
            for b in batches:
                _recorded.clear()
                q = torch.empty(b, shape.n_q, shape.d, device="meta", dtype=dtype)
                k = torch.empty(b, shape.hk * shape.wk, shape.d, device="meta", dtype=dtype)
                v = torch.empty(b, shape.hk * shape.wk, shape.dv, device="meta", dtype=dtype)
                rel = (b, shape.hq, shape.n_q // shape.hq) if shape.hq else (b, shape.n_q)
                rh = torch.empty(*rel, shape.hk, device="meta", dtype=dtype)
                rw = torch.empty(*rel, shape.wk, device="meta", dtype=dtype)
                out, lse = K.forward(q, k, v, rh, rw, 0.125, heads=shape.heads)
                K.backward(torch.empty_like(out), q, k, v, rh, rw, out, lse, 0.125)
                found.update(dict.fromkeys(_recorded))
        finally:
            K._launch = saved
    return list(found)


def _batch_sizes(shape: Shape) -> list[int]:
    """shape.b, or where it is None (any batch) every batch size whose rows class differs (_batches)."""
    return [shape.b] if shape.b is not None else _batches(shape.n_q, shape.heads)


def _batches(n_q: int, heads: int = 1) -> list[int]:
    """Batch sizes (multiples of heads) that reach every rows class of the config table (rows = batch * n_q): the
    least, each side of every threshold, and a large batch."""
    limits = {v for _, cond, _, _ in configs.TABLE for key, v in cond.items() if key in ("min_rows", "max_rows")}
    rows = {1, 1 << 24} | {r for v in limits for r in (v - 1, v, v + 1) if r > 0}
    per = n_q * heads  # rows a batch of one image takes; each row count is taken on both sides
    return sorted({heads * max(1, k) for r in rows for k in (r // per, -(-r // per))})


@contextlib.contextmanager
def _matmul_precision(precision: str):
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def build(launch: Launch, target: arch.Arch) -> Built:
    """Compile one launch for `target` (cached for the process; Triton caches the binary on disk)."""
    key = (launch, target)
    hit = _built.get(key)
    if hit is not None:
        return hit
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = launch.fn
    names = [p.name for p in fn.params]
    sig = dict(launch.signature)
    consts = dict(launch.constexprs)
    sig.update({n: "constexpr" for n in consts})
    src = ASTSource(fn=fn, signature={n: sig[n] for n in names if n in sig},
                    constexprs={(names.index(n),): v for n, v in consts.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in launch.aligned})
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", target.capability, 32), options=dict(launch.options))
        md = compiled.metadata
        regs, spills = _registers(compiled)
        result = Built(launch, target, shared=md.shared, registers=regs, spills=spills, tmem=_tmem(md))
    except Exception as e:  # CompilationError, OutOfResources (tensor memory), ptxas errors
        result = Built(launch, target, error=_error_text(e))
    _built[key] = result
    return result


def _error_text(e: BaseException) -> str:
    """`e`'s type and first line, then each cause's as a traceback walks them (__cause__, else __context__ unless
    suppressed). Triton raises an error in a called jit function as CompilationError("at LINE:COL:" and the caller's
    source) from that error, whose text says what failed; a CompilationError's own message, where it has one, comes
    last, so that line is taken."""
    def line(x: BaseException) -> str:
        text = getattr(x, "error_message", None) or str(x)
        return f"{type(x).__name__}: " + next((t for t in text.splitlines() if t.strip()), "")[:200]

    links, seen, x = [line(e)], {id(e)}, e
    while (x := x.__cause__ or (None if x.__suppress_context__ else x.__context__)) is not None and id(x) not in seen:
        links.append(line(x))
        seen.add(id(x))
    return links[0] + (f" (from {'; from '.join(links[1:])})" if len(links) > 1 else "")


def _tmem(md) -> int:
    for name in ("tmem_size", "tensor_memory_size"):
        val = getattr(md, name, None)
        if isinstance(val, int):
            return val
    return 0


def _registers(compiled) -> tuple[int, int]:
    """(registers per thread, bytes of stack per thread: the spills) from the cubin, read with Triton's cuobjdump
    (CompiledKernel.n_regs is only set once a GPU loads the binary)."""
    import os
    import re
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    cubin = compiled.asm.get("cubin")
    if not cubin or not os.path.exists(tool):
        return 0, 0
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    usage = re.search(r"REG:(\d+) STACK:(\d+)", out)
    return (int(usage.group(1)), int(usage.group(2))) if usage else (0, 0)


# what CPython's AST constructor says when two threads parse at once (build_all builds such a launch again)
_THREAD_RACE = "recursion depth mismatch"


def build_all(todo: list[tuple[Launch, arch.Arch]], workers: int | None = None) -> list[Built]:
    """build() for each (launch, target), in threads (ptxas runs as a subprocess); results in `todo`'s order."""
    if not todo:
        return []
    workers = workers or min(8, os.cpu_count() or 1, len(todo))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        built = list(pool.map(lambda pair: build(*pair), todo))
    # CPython builds AST objects with a process-wide recursion counter, so Triton parsing kernels in two threads at once
    # can fail with "SystemError: AST constructor recursion depth mismatch" (seen in CI, Python 3.11; in a called jit
    # function, as the cause of a CompilationError): such a launch is built again here, alone, rather than reported as
    # not building
    for i, b in enumerate(built):
        if b.error and _THREAD_RACE in b.error:
            _built.pop((b.launch, b.arch), None)
            built[i] = build(*todo[i])
    return built


def left_to_inductor(target: arch.Arch, dtype: torch.dtype, precision: str, shape: Shape) -> str | None:
    """The config table's reason for leaving `shape` to Inductor on `target` (its "place" rows) at any of its batch
    sizes (b None: every one whose rows class differs), or None."""
    for b in _batch_sizes(shape):
        reason = K.inductor_reason(dtype, precision, shape.d, shape.dv, shape.wk, b * shape.n_q, target)
        if reason:
            return reason
    return None


def misfit(target: arch.Arch, dtype: torch.dtype, precision: str, shape: Shape) -> str | None:
    """None if every launch for `shape` builds and fits on `target`; else the first reason it does not."""
    # the launches follow the config table in use (a benchmark's candidate rows, a test's OVERRIDES) and the head-dim
    # chunking, so the verdict is kept per table (held, so that its id is not reused) and overrides
    overrides = tuple(sorted((k, tuple(sorted(v.items()))) for k, v in configs.OVERRIDES.items()))
    key = (target, dtype, precision, shape, id(configs.TABLE), overrides, tiles.SPLIT_HEAD_DIM)
    if key in _verdicts and _verdicts[key][0] is configs.TABLE:
        return _verdicts[key][1]
    built = build_all([(launch, target) for launch in launches(target, dtype, precision, shape)])
    reason = next((b.misfit for b in built if b.misfit), None)
    _verdicts[key] = (configs.TABLE, reason)
    return reason
