"""The GPU architectures the kernels are built for, and which one a tensor's device is.

An architecture class is what the block configs depend on: the shared memory one CTA may have (99 KB on
consumer Ampere / Ada / Blackwell, 163 KB on the A100, 227 KB on Hopper and datacenter Blackwell) and the
compute capability, which picks Triton's MMA family (mma.sync on sm_8x and sm_120, wgmma on sm_90, tcgen05 with
tensor memory on sm_100).

    arch.of(q.device)          # the Arch of a CUDA device (None for CPU and other devices)
    SAMHQ_FX_ARCH=sm_86 ...    # emulate another architecture's decisions and configs on the GPU at hand (tests,
                               # benchmarks): the configs and compile checks are those of sm_86, the kernels run
                               # on the real device, which must have at least that much shared memory
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Arch:
    name: str  # "sm_90"
    capability: int  # major * 10 + minor: 90
    smem: int  # bytes of shared memory one CTA may ask for (the opt-in maximum)
    gpus: str  # the GPUs of this class, for reports

    @property
    def mma(self) -> str:
        """Triton's tensor-core family on this architecture."""
        if self.capability >= 120 or self.capability < 90:
            return "mma"  # mma.sync (sm_120 has no wgmma / tcgen05)
        return "wgmma" if self.capability < 100 else "tcgen05"


# one per class the configs tell apart; smem from the CUDA programming guide's per-capability table
ARCHS = {a.name: a for a in (
    Arch("sm_80", 80, 166912, "A100, A30"),
    Arch("sm_86", 86, 101376, "A10, A40, RTX 3090"),
    Arch("sm_89", 89, 101376, "L4, L40S, RTX 4090"),
    Arch("sm_90", 90, 232448, "H100, H200"),
    Arch("sm_100", 100, 232448, "B200, GB200"),
    Arch("sm_120", 120, 101376, "RTX 5090, RTX PRO 6000"),
)}

# what the configs assume where no device says otherwise (the interpreter, meta tensors outside `assume`)
DEFAULT = ARCHS["sm_90"]


def by_capability(capability: int, smem: int | None = None) -> Arch:
    """The Arch of a compute capability (major * 10 + minor): the listed class with the same major version and the
    nearest capability at or below it (sm_87 -> sm_86's family with its own figures), with `smem` if the device
    reported it."""
    same_major = [a for a in ARCHS.values() if a.capability // 10 == capability // 10 and a.capability <= capability]
    base = max(same_major, key=lambda a: a.capability) if same_major else min(
        ARCHS.values(), key=lambda a: abs(a.capability - capability))
    name = f"sm_{capability}"
    if name == base.name and (smem is None or smem == base.smem):
        return base
    return Arch(name, capability, smem if smem is not None else base.smem, base.gpus if name == base.name else name)


_devices: dict[int, Arch] = {}
_assumed: list[Arch] = []


def emulated() -> Arch | None:
    """The architecture SAMHQ_FX_ARCH names (sm_80, sm_86, sm_89, sm_90, sm_100, sm_120), or None."""
    name = os.environ.get("SAMHQ_FX_ARCH", "")
    if not name:
        return None
    if name not in ARCHS:
        raise ValueError(f"SAMHQ_FX_ARCH must be one of {', '.join(ARCHS)}, got {name!r}")
    return ARCHS[name]


def of(device: torch.device) -> Arch | None:
    """The Arch whose configs and checks apply to tensors on `device`: SAMHQ_FX_ARCH if set, else the CUDA device's
    own; for meta tensors the one `assume` holds. None for CPU and other devices (no GPU kernels there)."""
    if device.type == "meta":
        return _assumed[-1] if _assumed else None
    if device.type != "cuda":
        return None
    emu = emulated()
    if emu is not None:
        return emu
    index = device.index if device.index is not None else torch.cuda.current_device()
    hit = _devices.get(index)
    if hit is None:
        props = torch.cuda.get_device_properties(index)
        smem = getattr(props, "shared_memory_per_block_optin", None)
        hit = _devices[index] = by_capability(props.major * 10 + props.minor, smem)
    return hit


@contextlib.contextmanager
def assume(a: Arch):
    """Within the block, meta tensors count as tensors on an `a` device (cross-compiling launches without one)."""
    _assumed.append(a)
    try:
        yield a
    finally:
        _assumed.pop()
