"""The fused op's output layout: heads-last ([B, N, heads, Dv] memory) where the model reads heads next to features.

SAM's layers (both HF classes, segment-anything, timm's SAM ViT, MViTv2) put the attention output in
[B, H, W, heads * Dv] order for the projection after it: `view(B, heads, H, W, -1).permute(0, 2, 3, 1, 4).reshape(...)`
or `transpose(1, 2).reshape(...)`. From the op's [B*heads, N, Dv] that reshape is a copy kernel a layer (SDPA's
kernels write heads-last, so Inductor's build has none); from a heads-last output it is a view. `heads_last(match)`
says, per matched attention, whether the rewrite asks the op for it: only where the users still run, nothing writes
into the shared memory, and a copy goes.
"""

from __future__ import annotations

import heapq
import operator

import torch
from torch.fx import Node
from torch.multiprocessing.reductions import StorageWeakRef

from .patterns.fx_utils import fake_run, is_static, same_shape, shape, value
from .patterns.rel_pos_attention import Match

# users the heads-last layout is followed through before it is given up (its re-run values must come back to the
# old layouts within this many nodes; SAM's take 3: view, permute, reshape)
_HEADS_LAST_REACH = 8


def _heads_of_users(m: Match) -> int:
    """A 3-D output's heads as its users read them: every user a view / reshape to [B, heads, ...] (SAM's
    `(attn @ v).view(B, heads, H, W, -1)`); 1 where they do not all agree on a static heads above 1."""
    found = set()
    for user in m.output.users:
        name = user.target if user.op == "call_method" else getattr(user.target, "__name__", None)
        sizes = user.args[1:] if user.op == "call_method" else user.args[1:] or user.kwargs.get("shape", ())
        if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
            sizes = sizes[0]
        if name not in ("view", "reshape") or len(sizes) < 3 or not is_static(sizes[1]):
            return 1
        found.add(sizes[1])
    return found.pop() if len(found) == 1 and next(iter(found)) > 1 else 1


def _copies(node: Node, result, env: dict) -> int:
    """1 if `result`, node's value run on env's values, shares memory with none of node's tensor inputs (a copy or a
    computed tensor), else 0 (a view)."""
    storage = StorageWeakRef(result.untyped_storage())
    inputs = [env.get(a, value(a)) for a in node.all_input_nodes]
    return int(all(not isinstance(t, torch.Tensor) or StorageWeakRef(t.untyped_storage()) != storage for t in inputs))


_INPLACE_FUNCTIONS = {operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv}


def _mutates(node: Node) -> bool:
    """Whether node writes into a tensor it is given: x.mul_(...), x[i] = y, x += y, F.relu(x, inplace=True), out=."""
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.endswith("__")
    name = getattr(node.target, "__name__", "")
    return (node.target in _INPLACE_FUNCTIONS or (name.endswith("_") and not name.endswith("__"))
            or node.kwargs.get("inplace") is True or "out" in node.kwargs)


def _heads_last_uses(m: Match, heads: int, fake_mode) -> dict | None:
    """The users' fake values when the match's output is handed over heads-last ([*batch, heads, N, Dv] whose memory
    is [*batch, N, heads, Dv]), or None where that is no better or not safe: a view the new strides do not allow, a
    changed layout that reaches the graph's output or runs past _HEADS_LAST_REACH nodes, no copy fewer among the
    users, or an in-place write to what would then share the output's memory (the op saves it for the backward).
    Users are re-run in graph order on fake values, old and new, until each new value has its old shape and strides
    again (SAM's reshape to [B, H, W, C], a copy before, is then a view)."""
    # the baseline is the op's own heads-first output ([*batch, heads, N, Dv] contiguous), not the matched node's
    # recorded value: SDPA's efficient and flash kernels already write heads-last, so against their strides the
    # reshape was a view either way and heads-last looked like no saving, while the op's output then cost the copy
    recorded = value(m.output)
    with fake_mode:
        old = recorded.new_empty(recorded.shape)
        if old.dim() >= 4:
            *lead, h, n, dv = old.shape
            new = old.new_empty((*lead, n, h, dv)).transpose(-3, -2)
        else:
            b, n, dv = old.shape
            new = old.new_empty((b // heads, n, heads, dv)).transpose(1, 2)
    order = {node: i for i, node in enumerate(m.output.graph.nodes)}
    env, old_env, saved, shared = {m.output: new}, {m.output: old}, 0, [m.output]
    todo = [(order[u], u) for u in m.output.users]
    while todo:
        _, user = heapq.heappop(todo)  # graph order: a node runs once every input it takes from here has run
        if user in env:
            continue
        if user.op not in ("call_function", "call_method") or len(env) > _HEADS_LAST_REACH or _mutates(user):
            return None
        try:
            result, before = fake_run(user, fake_mode, env), fake_run(user, fake_mode, old_env)
        except Exception:  # noqa: BLE001 - a view these strides do not allow, or any other refusal
            return None
        env[user], old_env[user] = result, before
        if isinstance(result, torch.Tensor) != isinstance(before, torch.Tensor):
            return None
        if not isinstance(result, torch.Tensor):
            continue
        copied_before, copied = _copies(user, before, old_env), _copies(user, result, env)
        saved += copied_before - copied
        if not copied:  # a view of what the op writes
            shared.append(user)
        if not (same_shape(result.shape, before.shape) and same_shape(result.stride(), before.stride())):
            todo += [(order[u], u) for u in user.users]
    if saved <= 0 or _written_later(shared):
        return None
    del env[m.output]
    return env


def _written_later(shared: list[Node]) -> bool:
    """Whether anything writes in place into these nodes' values or views of them (by their recorded values), within
    _HEADS_LAST_REACH nodes."""
    seen, todo = set(shared), list(shared)
    while todo:
        node = todo.pop()
        for user in node.users:
            if user in seen:
                continue
            if _mutates(user):
                return True
            v, base = value(user), value(node)
            if v is not None and base is not None and len(seen) <= _HEADS_LAST_REACH and (
                    StorageWeakRef(v.untyped_storage()) == StorageWeakRef(base.untyped_storage())):
                seen.add(user)  # a view of it (recorded so): its users may write into it too
                todo.append(user)
    return False


def heads_last(m: Match) -> tuple[int, dict]:
    """(heads, the users' new fake values) where the fused op should write its output heads-last, else (1, {}).
    Heads-last is the order the projection after attention reads ([B, H, W, heads * Dv]): an output in
    [B*heads, N, Dv] order costs a copy kernel a layer to get there (the SDPA kernels write heads-last)."""
    target = shape(m.output)
    if len(target) >= 4:
        heads = target[-3] if is_static(target[-3]) else 1
    else:
        heads = _heads_of_users(m) if len(target) == 3 else 1
    if heads <= 1:
        return 1, {}
    uses = _heads_last_uses(m, heads, value(m.q).fake_mode)
    return (1, {}) if uses is None else (heads, uses)
