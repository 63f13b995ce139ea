"""Point one kernel of a captured CUDA graph at new input addresses before each replay (CUDA driver API).

A CUDA graph replays its kernels with the arguments they were captured with. The 076 entry wants its
first kernel (entry_stage's cast of the fresh inputs) inside its graph, reading inputs whose addresses change
every call: launched before the replay instead, the GPU waited 22-94 us between that kernel and the graph's
first one on 11 of the 16 workloads (the host's time to reach cudaGraphLaunch; the H200, 2026-12-01). CUDA's
answer is to update the kernel node of the instantiated graph, cuGraphExecKernelNodeSetParams: the graph
stays as it is, one kernel reads other addresses, and a call is one graph launch.

    args = KernelNodePointers(graph, old_pointers)   # graph: torch.cuda.CUDAGraph(keep_graph=True), instantiated
    args.set(new_pointers)                           # then graph.replay()

The node is found by its arguments: the one kernel node whose pointer arguments include every one of
`old_pointers` (the capture-time inputs' addresses, which no other kernel of the graph reads). Its argument
count and sizes come from cuFuncGetParamInfo (CUDA >= 12.4); every argument but the patched ones keeps the
value the node was captured with. Anything missing (the driver symbols, keep_graph in torch, a unique node)
raises GraphArgsUnavailable, and the caller falls back to launching the kernel before the replay.

    exec_ = PriorityExec(graph)                      # the same graph, its kernels at their streams' priorities
    args = KernelNodePointers(graph, old_pointers, exec_.handle); args.set(new_pointers); exec_.launch()

A graph launched with torch's replay runs every kernel at the launching stream's priority. Stream capture records
each kernel's stream priority in its node, and an exec instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY
keeps them: where the graph runs branches side by side, the block scheduler then serves the high-priority
branch's blocks first.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_int, c_size_t, c_uint, c_uint64, c_void_p


class GraphArgsUnavailable(RuntimeError):
    """The graph's kernel arguments cannot be updated here (why in the message)."""


class _KernelNodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2 (cuda.h)
    _fields_ = [("func", c_void_p), ("gridDimX", c_uint), ("gridDimY", c_uint), ("gridDimZ", c_uint),
                ("blockDimX", c_uint), ("blockDimY", c_uint), ("blockDimZ", c_uint), ("sharedMemBytes", c_uint),
                ("kernelParams", POINTER(c_void_p)), ("extra", POINTER(c_void_p)), ("kern", c_void_p),
                ("ctx", c_void_p)]


_KERNEL_NODE = 0  # CU_GRAPH_NODE_TYPE_KERNEL
_USE_NODE_PRIORITY = 8  # CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY
_PRIORITY = 8  # CU_LAUNCH_ATTRIBUTE_PRIORITY
_DRIVER = None


def _driver():
    global _DRIVER
    if _DRIVER is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fns = {name: getattr(lib, name) for name in (
                "cuGraphGetNodes", "cuGraphNodeGetType", "cuGraphKernelNodeGetParams_v2", "cuFuncGetParamInfo",
                "cuGraphExecKernelNodeSetParams_v2", "cuGraphInstantiateWithFlags", "cuGraphLaunch",
                "cuGraphExecDestroy", "cuGraphKernelNodeGetAttribute")}
        except (OSError, AttributeError) as e:
            raise GraphArgsUnavailable(f"CUDA driver API: {e}") from e
        for fn in fns.values():
            fn.restype = c_int
        _DRIVER = fns
    return _DRIVER


def _call(name: str, *args) -> None:
    err = _driver()[name](*args)
    if err != 0:
        raise GraphArgsUnavailable(f"{name} returned CUDA error {err}")


def _param_sizes(func: int) -> list[int]:
    sizes, off, size = [], c_size_t(), c_size_t()
    while len(sizes) < 1024 and _driver()["cuFuncGetParamInfo"](c_void_p(func), c_size_t(len(sizes)), byref(off),
                                                                 byref(size)) == 0:
        sizes.append(size.value)
    return sizes


def _raw_graph(graph) -> int:
    try:
        return graph.raw_cuda_graph()
    except (AttributeError, RuntimeError) as e:
        raise GraphArgsUnavailable(f"torch.cuda.CUDAGraph: {e}") from e


def _kernel_nodes(raw: int) -> list[int]:
    n = c_size_t(0)
    _call("cuGraphGetNodes", c_void_p(raw), None, byref(n))
    nodes = (c_void_p * n.value)()
    _call("cuGraphGetNodes", c_void_p(raw), nodes, byref(n))
    kernels = []
    for node in nodes:
        kind = c_int(-1)
        _call("cuGraphNodeGetType", c_void_p(node), byref(kind))
        if kind.value == _KERNEL_NODE:
            kernels.append(node)
    return kernels


class PriorityExec:
    """`graph` (a torch.cuda.CUDAGraph made with keep_graph=True) instantiated again, with node priorities."""

    def __init__(self, graph):
        raw = _raw_graph(graph)
        handle = c_void_p()
        _call("cuGraphInstantiateWithFlags", byref(handle), c_void_p(raw), c_uint64(_USE_NODE_PRIORITY))
        self.handle = handle.value
        self.priorities: dict[int, int] = {}  # priority -> kernel nodes (what the capture recorded)
        value = (ctypes.c_byte * 64)()  # CUlaunchAttributeValue; the priority is its first int
        for node in _kernel_nodes(raw):
            if _driver()["cuGraphKernelNodeGetAttribute"](c_void_p(node), c_int(_PRIORITY), value) == 0:
                p = c_int.from_buffer(value).value
                self.priorities[p] = self.priorities.get(p, 0) + 1

    def launch(self, stream: int) -> None:
        _call("cuGraphLaunch", c_void_p(self.handle), c_void_p(stream))

    def __del__(self):
        if _DRIVER is not None and getattr(self, "handle", None):
            _DRIVER["cuGraphExecDestroy"](c_void_p(self.handle))


class KernelNodePointers:
    """The kernel node of `graph` (a torch.cuda.CUDAGraph made with keep_graph=True, instantiated) whose
    pointer arguments include all of `pointers`; set() gives those arguments new values in the graph's exec
    (`exec_`, a handle; default torch's)."""

    def __init__(self, graph, pointers: list[int], exec_: int | None = None):
        if len(set(pointers)) != len(pointers):
            raise GraphArgsUnavailable("the pointers to patch are not distinct, so their slots are ambiguous")
        raw = _raw_graph(graph)
        if exec_ is None:
            try:
                exec_ = graph.raw_cuda_graph_exec()
            except (AttributeError, RuntimeError) as e:
                raise GraphArgsUnavailable(f"torch.cuda.CUDAGraph: {e}") from e
        self._exec = c_void_p(exec_)
        found = []
        for node in _kernel_nodes(raw):
            params = _KernelNodeParams()
            _call("cuGraphKernelNodeGetParams_v2", c_void_p(node), byref(params))
            if not params.func or not params.kernelParams:
                continue
            sizes = _param_sizes(params.func)
            values = [c_uint64.from_address(params.kernelParams[i]).value if s == 8 else None
                      for i, s in enumerate(sizes)]
            where = [values.index(p) if p in values else None for p in pointers]
            if None not in where:
                found.append((node, params, sizes, where))
        if len(found) != 1:
            raise GraphArgsUnavailable(f"{len(found)} kernel nodes read all {len(pointers)} pointers (expected 1)")
        node, params, sizes, where = found[0]
        self._node = c_void_p(node)
        self._values = (c_uint64 * len(pointers))(*pointers)
        # the new argument array: the node's own values (owned by the node, valid while it is unchanged; only the
        # exec is updated), except the patched slots, which point at self._values
        self._array = (c_void_p * len(sizes))(*[params.kernelParams[i] for i in range(len(sizes))])
        for j, i in enumerate(where):
            self._array[i] = ctypes.addressof(self._values) + 8 * j
        self._params = _KernelNodeParams.from_buffer_copy(params)
        self._params.kernelParams = ctypes.cast(self._array, POINTER(c_void_p))
        self._params.extra = None

    def set(self, pointers: list[int]) -> None:
        for j, p in enumerate(pointers):
            self._values[j] = p
        _call("cuGraphExecKernelNodeSetParams_v2", self._exec, self._node, byref(self._params))
