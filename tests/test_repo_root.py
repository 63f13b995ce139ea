"""Python started in the repository root, as a user does with `python train.py` or a notebook in the clone.

The root is then first on sys.path, where the top-level `kernels/` folder answers to the bare name `kernels`; the
Hugging Face hub package of that name is what transformers imports (and requires from 5.25), so the folder must
hand the name over instead of hiding it.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run_in_root(code: str) -> str:
    env_code = "import sys; assert sys.path[0] in ('', %r), sys.path[:2]; " % str(ROOT)
    proc = subprocess.run([sys.executable, "-c", env_code + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_transformers_sam_imports_from_the_repo_root():
    pytest.importorskip("transformers")
    out = _run_in_root("from transformers import SamHQModel, SamModel; import kernels; print(kernels.__file__)")
    kernels_file = Path(out.strip().splitlines()[-1])
    hub = importlib.util.find_spec("kernels")
    if hub is not None and Path(hub.origin).resolve() != ROOT / "kernels" / "__init__.py":
        # the hub package is installed: the bare name is its, not this checkout's folder
        assert kernels_file.resolve() == Path(hub.origin).resolve(), out


def test_samhq_kernels_and_the_bare_name_are_different_modules_from_the_root():
    out = _run_in_root("import kernels, samhq_fx.kernels.rel_pos_attention as k; "
                       "print(kernels.__name__, k.__name__, hasattr(kernels, 'rel_pos_attention'))")
    assert out.split() == ["kernels", "samhq_fx.kernels.rel_pos_attention", "False"], out
