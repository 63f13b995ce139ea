"""Write the 076 entry as a SOL-ExecBench solution: one solution.json with every source it needs inline.

    python benchmarks/sol076/write_solution.py OUT/solution.json
    python benchmarks/sol076/write_solution.py OUT/solution.json --definition NAME --target-hardware B200,LOCAL

SOL-ExecBench's solution format (its docs/solution.md): a JSON object with `name`, `definition` (the name of the
problem's definition), `author`, `description`, `spec` (languages, target_hardware, entry_point
"file.py::function", dependencies, destination_passing_style) and `sources` ([{"path", "content"}], paths relative,
written out as a directory that the evaluator puts first on sys.path before it imports the entry point's module).
The sources here are submission.py (the entry point, `submission.py::run`), the modules of this folder it imports
(entry.py, entry_stage.py, graph_kernel_args.py, rel_pos_ops.py, rel_pos_tables.py) and the samhq_fx modules they
import, at the paths they import from (samhq_fx/op.py, samhq_fx/reference.py, samhq_fx/kernels/*.py, the packages'
__init__.py): found by following the import statements from submission.py, the package folders read from
pyproject.toml, so the solution carries exactly the code the entry runs here. Return-value style
(destination_passing_style false): run() returns the 7 gradients. target_hardware defaults to LOCAL: the fused
kernels are verified on Hopper (an H200), SOL-ExecBench's B200 only lists where a solution may run.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ENTRY_POINT = "submission.py::run"
DEFINITION = "L2/076_sam_hq_vision_attention_with_relative_position_backward"  # the problem, as the leaderboard names it
DESCRIPTION = ("SAM-HQ vision attention backward written out, no autograd: the forward recomputed with samhq-fx's "
               "fused rel-pos attention (Triton, no N x N matrix), its deterministic backward, the rel-pos terms and "
               "their gradients as GEMMs against both tables, bf16 operands with fp32 accumulation, one CUDA graph "
               "per workload (entry.make_solution(compute='bf16', staged=True)).")
HARDWARE = ("B200", "LOCAL")  # SOL-ExecBench's target_hardware values


def package_dirs() -> dict[str, Path]:
    """Installed package name -> its folder in the repo (pyproject.toml's [tool.setuptools.package-dir])."""
    with open(REPO / "pyproject.toml", "rb") as f:
        dirs = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name: REPO / folder for name, folder in dirs.items()}


def module_source(name: str, packages: dict[str, Path]) -> tuple[str, Path] | None:
    """(path in the solution, file in the repo) of module `name`, or None for a module from elsewhere (torch, triton):
    a module of the repo's packages at its dotted path, a top-level module of this folder at the top."""
    package = max((p for p in packages if name == p or name.startswith(p + ".")), key=len, default=None)
    if package is not None:
        rest = name[len(package):].lstrip(".").replace(".", "/")
        base = packages[package] / rest if rest else packages[package]
        prefix = name.replace(".", "/")
        if (base / "__init__.py").is_file():
            return prefix + "/__init__.py", base / "__init__.py"
        if base.with_suffix(".py").is_file():
            return prefix + ".py", base.with_suffix(".py")
        return None
    if "." not in name and (HERE / f"{name}.py").is_file():
        return f"{name}.py", HERE / f"{name}.py"
    return None


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Every module name an import statement of `module` may load (anywhere in it: inside try blocks and functions
    too): for `from a import b`, both a and a.b (b may be a submodule); relative imports resolved."""
    names = []
    here = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[:len(here.split(".")) - node.level + 1] if here else []
                base = ".".join(anchor + ([base] if base else []))
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    return [n for n in names if n]


def sources(entry_point: str = ENTRY_POINT) -> list[dict]:
    """The solution's sources: the entry point's module and every module of the repo it imports, transitively,
    with the __init__.py of each package on the way; the entry point first, the rest by path."""
    packages = package_dirs()
    start = entry_point.split("::")[0].removesuffix(".py")
    found: dict[str, Path] = {}
    todo = [start]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for k in range(1, len(parts) + 1):  # the packages above a module run before it
            src = module_source(".".join(parts[:k]), packages)
            if src is None or src[0] in found:
                continue
            path, file = src
            found[path] = file
            mod = ".".join(parts[:k])
            todo += imported_names(ast.parse(file.read_text(), str(file)), mod, path.endswith("__init__.py"))
    first = f"{start}.py"
    return [{"path": p, "content": found[p].read_text()} for p in [first] + sorted(set(found) - {first})]


def solution(name: str = "samhq_fx_sol076_bf16_staged", definition: str = DEFINITION, author: str = "samhq-fx",
             target_hardware=("LOCAL",), description: str = DESCRIPTION) -> dict:
    """The solution.json object (SOL-ExecBench's docs/solution.md). ValueError naming target_hardware for a value it
    does not take."""
    bad = [h for h in target_hardware if h not in HARDWARE]
    if bad or not target_hardware:
        raise ValueError(f"target_hardware must be a non-empty list of {', '.join(HARDWARE)}, got {list(target_hardware)}")
    return {"name": name, "definition": definition, "author": author, "description": description,
            "spec": {"languages": ["triton"], "target_hardware": list(target_hardware), "entry_point": ENTRY_POINT,
                     "dependencies": ["torch", "triton"], "destination_passing_style": False},
            "sources": sources()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the solution.json to write (its folder is made)")
    ap.add_argument("--name", default="samhq_fx_sol076_bf16_staged", help="the solution's name")
    ap.add_argument("--definition", default=DEFINITION,
                    help="the name of the problem's definition (its definition.json's `name`)")
    ap.add_argument("--author", default="samhq-fx")
    ap.add_argument("--target-hardware", default="LOCAL", help=f"comma list of {', '.join(HARDWARE)} (default LOCAL)")
    args = ap.parse_args(argv)
    try:
        sol = solution(args.name, args.definition, args.author, tuple(args.target_hardware.split(",")))
    except ValueError as e:
        ap.error(f"--target-hardware: {e}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(sol, f, indent=1)
    print(f"wrote {args.out}: {len(sol['sources'])} sources, entry point {sol['spec']['entry_point']}:\n  "
          + "\n  ".join(s["path"] for s in sol["sources"]))
    return sol


if __name__ == "__main__":
    main()
