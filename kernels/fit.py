"""Does every kernel launch of one rel-pos attention shape build and fit on a GPU architecture? Asked without one.

The host functions (rel_pos_attention.forward / backward) run on meta tensors with their launches recorded, and each
recorded launch is compiled by Triton for the architecture's target (Triton ships ptxas, so a CPU machine can build
for sm_80 to sm_120). A launch fits when it compiles (tensor memory included on sm_100) and asks for no more shared
memory than one CTA may have there. The rewrite asks this at compile time, on the device it compiles for, and leaves
an attention it cannot fuse to Inductor; `python -m samhq_fx.kernels.fit` prints the same facts as a table.

    # q: [B, Nq, D]   k, v: [B, Nk, D]   rel_h: [B, Nq, Hk]   rel_w: [B, Nq, Wk]
    fit.misfit(arch.ARCHS["sm_86"], torch.float32, "highest", Shape(b=12, n_q=4096, hk=64, wk=64, d=64, dv=64))
    -> None, or why not ("backward dq needs 176 KB of shared memory, sm_80 has 163 KB")

Compiles are typed as Inductor types user kernels (Python floats as fp64 scalars, ints equal to 1 as constants), the
way the triton_op registration is compiled; Triton's disk cache keeps each binary, and this module's own cache keeps
each verdict for the life of the process.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import triton

from . import arch, configs
from . import rel_pos_attention as K


@dataclass(frozen=True)
class Shape:
    """One fused attention's sizes: b = batch * heads (None: any, as with a dynamic batch), queries, key grid, head
    dims; rel4d: the rel-pos terms come as [B, Hq, Wq, K] (the query grid as two dims, hq rows)."""
    b: int | None
    n_q: int
    hk: int
    wk: int
    d: int
    dv: int
    hq: int = 0


@dataclass(frozen=True)
class Launch:
    """One recorded kernel launch: what decides its binary."""
    kernel: str  # "fwd", or "bwd:dq" / "bwd:dkdv" / "bwd:both"
    signature: tuple  # ((name, type), ...) of the runtime arguments
    constexprs: tuple  # ((name, value), ...)
    options: tuple  # ((num_warps, n), (num_stages, n))
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
        return None


_PTR = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}
_lock = threading.Lock()  # recording swaps the host code's launcher
_built: dict[tuple, Built] = {}
_verdicts: dict[tuple, str | None] = {}


def _record(kernel, grid, *args, **kwargs):
    names = [p.name for p in kernel.params]
    sig, consts = [], []
    for name, val in zip(names, args):
        if isinstance(val, torch.Tensor):
            sig.append((name, _PTR[val.dtype]))
        elif isinstance(val, float):
            sig.append((name, "fp64"))  # what Inductor's user-kernel codegen declares for Python floats
        elif val == 1:
            consts.append((name, 1))
        else:
            sig.append((name, "i32"))
    options = tuple((k, kwargs[k]) for k in ("num_warps", "num_stages") if k in kwargs)
    consts += [(n, kwargs[n]) for n in names[len(args):] if n in kwargs]
    part = dict(consts).get("PART")
    label = kernel.__name__.strip("_").removesuffix("_kernel") + (f":{part}" if part else "")
    _recorded.append(Launch(label, tuple(sig), tuple(consts), options, kernel))


_recorded: list[Launch] = []


def launches(target: arch.Arch, dtype: torch.dtype, precision: str, shape: Shape) -> list[Launch]:
    """Every launch forward + backward make for `shape` on `target` (precision: torch's fp32 matmul setting).
    With b None, the launches of every batch size: the configs change with rows only at the table's thresholds."""
    rows = [shape.b] if shape.b is not None else _batches(shape.n_q)
    found: dict[Launch, None] = {}
    with _lock, _matmul_precision(precision), arch.assume(target):
        saved = K._launch
        K._launch = _record
        try:
            for b in rows:
                _recorded.clear()
                q = torch.empty(b, shape.n_q, shape.d, device="meta", dtype=dtype)
                k = torch.empty(b, shape.hk * shape.wk, shape.d, device="meta", dtype=dtype)
                v = torch.empty(b, shape.hk * shape.wk, shape.dv, device="meta", dtype=dtype)
                rel = (b, shape.hq, shape.n_q // shape.hq) if shape.hq else (b, shape.n_q)
                rh = torch.empty(*rel, shape.hk, device="meta", dtype=dtype)
                rw = torch.empty(*rel, shape.wk, device="meta", dtype=dtype)
                out, lse = K.forward(q, k, v, rh, rw, 0.125)
                K.backward(torch.empty_like(out), q, k, v, rh, rw, out, lse, 0.125)
                found.update(dict.fromkeys(_recorded))
        finally:
            K._launch = saved
    return list(found)


def _batches(n_q: int) -> list[int]:
    """Batch sizes that reach every rows class of the config table (rows = batch * n_q): 1, each side of every
    threshold, and a large batch."""
    limits = {v for _, cond, _, _ in configs.TABLE for key, v in cond.items() if key in ("min_rows", "max_rows")}
    rows = {1, 1 << 24} | {r for v in limits for r in (v - 1, v, v + 1) if r > 0}
    return sorted({max(1, -(-r // n_q)) for r in rows})


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
                    constexprs={(names.index(n),): v for n, v in consts.items()})
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", target.capability, 32), options=dict(launch.options))
        md = compiled.metadata
        regs, spills = _registers(compiled)
        result = Built(launch, target, shared=md.shared, registers=regs, spills=spills, tmem=_tmem(md))
    except Exception as e:  # CompilationError, OutOfResources (tensor memory), ptxas errors
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        result = Built(launch, target, error=f"{type(e).__name__}: {first[:200]}")
    _built[key] = result
    return result


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


def misfit(self) -> str | None:
        """None if the launch runs there; else why not, in a sentence."""
        if self.error:
            return f"{self.launch.kernel} does not build for {self.arch.name}: {self.error}"
        if self.shared > self.arch.smem:
            return (f"{self.launch.kernel} needs {self.shared // 1024} KB of shared memory, {self.arch.name} has "
                    f"{self.arch.smem // 1024} KB")
        return None


_PTR = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}
_lock = threading.Lock()  # recording swaps the host code's launcher
_built: dict[tuple, Built] = {}
_verdicts: dict[tuple, str | None] = {}


def _record(kernel, grid, *args, **kwargs):
    names = [p.name for p in kernel.params]
    sig, consts = [], []
    for name, val in zip(names, args):
        if isinstance(val, torch.Tensor):
            sig.append((name, _PTR[val.dtype]))
        elif isinstance(val, float):
            sig.append((name, "fp64"))  # what Inductor's user-kernel codegen declares for Python floats
        elif val == 1:
            consts.append((name, 1))
        else:
            sig.append((name, "i32"))
    options = tuple((k, kwargs[k]) for k in ("num_warps", "num_stages") if k in kwargs)
    consts += [(n, kwargs[n]) for n in names[len(args):] if n in kwargs]
    part = dict(consts).get("PART")
    label = kernel.__name__.strip("_").removesuffix("_kernel") + (f":{part}" if part else "")
    _recorded.append(Launch(label, tuple(sig), tuple(consts), options, kernel))


_recorded: list[Launch] = []


def launches(target: arch.Arch, dtype: torch.dtype, precision: str, shape: Shape) -> list[Launch]:
    """Every launch forward + backward make for `shape` on `target` (precision: torch's fp32 matmul setting).
    With b None, the launches of every batch size: the configs change with rows only at the table's thresholds."""
    rows = [shape.b] if shape.b is not None else _batches(shape.n_q)
    found: dict[Launch, None] = {}
    with _lock, _matmul_precision(precision), arch.assume(target):
        saved = K._launch
        K._launch = _record
        try:
            for b in rows:
                _recorded.clear()
                q = torch.empty(b, shape.n_q, shape.d, device="meta", dtype=dtype)
                k = torch.empty(b, shape.hk * shape.wk, shape.d, device="meta", dtype=dtype)
                v = torch.empty(b, shape.hk * shape.wk, shape.dv, device="meta", dtype=dtype)
                rel = (b, shape.hq, shape.n_q // shape.hq) if shape.hq else (b, shape.n_q)
                rh = torch.empty(*rel, shape.hk, device="meta", dtype=dtype)
                rw = torch.empty(*rel, shape.wk, device="meta", dtype=dtype)
                out, lse = K.forward(q, k, v, rh, rw, 0.125)
                K.backward(torch.empty_like(out), q, k, v, rh, rw, out, lse, 0.125)
                found.update(dict.fromkeys(_recorded))
        finally:
            K._launch = saved
    return list(found)


def _batches(n_q: int) -> list[int]:
    """Batch sizes that reach every rows class of the config table (rows = batch * n_q): 1, each side of every
    threshold, and a large batch."""
    limits = {v for _, cond, _, _ in configs.TABLE for key, v in cond.items() if key in ("min_rows", "max_rows")}
    rows = {1, 1 << 24} | {r for v in limits for r in (v - 1, v, v + 1) if r > 0}
    return sorted({max(1, -(-r // n_q)) for r in rows})


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
                    constexprs={(names.index(n),): v for n, v in consts.items()})
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", target.capability, 32), options=dict(launch.options))
        md = compiled.metadata
        regs, spills = _registers(compiled)
        result = Built(launch, target, shared=md.shared, registers=regs, spills=spills, tmem=_tmem(md))
    except Exception as e:  # CompilationError, OutOfResources (tensor memory), ptxas errors
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        result = Built(launch, target, error=f"{type(e).__name__}: {first[:200]}")
    _built[key] = result
    return result


def _tmem(md) -> int:
    for name in ("tmem_size", "tensor_memory_size"):
        val = getattr(md, name, None)
        if isinstance(val, int):
            return val
    return 0


def _with_registers(b: Built, compiled) -> Built:
    """Registers and spills from the cubin's resource usage (cuobjdump --dump-resource-usage), where Triton ships it."""
    import os
    import re
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    cubin = compiled.asm.get("cubin")
    if not cubin or not os.path.exists(tool):
        return b
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", out)
    spills = re.search(r"STACK:(\d+)", out)
    return Built(b.launch, b.arch, b.shared, int(regs.group(1)) if regs else 0,
                 int(spills.group(1)) if spills else 0, b.tmem, b.error)


def misfit(target: arch.Arch, dtype: torch.dtype, precision: str, shape: Shape) -> str | None:
    """None if every launch for `shape` builds and fits on `target`; else the first reason it does not."""
    key = (target, dtype, precision, shape)
    if key in _verdicts:
        return _verdicts[key]
    todo = launches(target, dtype, precision, shape)
    with ThreadPoolExecutor(max_workers=min(8, len(todo) or 1)) as pool:  # ptxas runs as a subprocess
        built = list(pool.map(lambda launch: build(launch, target), todo))
    reason = next((b.misfit for b in built if b.misfit), None)
    _verdicts[key] = reason
    return reason
