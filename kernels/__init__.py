"""Triton kernels for decomposed rel-pos attention (installed as ``samhq_fx.kernels``).

Python started in the repository root puts the root on sys.path, where this folder would answer to the bare
name `kernels` and hide the Hugging Face hub package of that name, which transformers imports. Imported under
that name, this file hands the name to the installed package, if there is one.
"""

if __name__ == "kernels":
    import importlib.machinery
    import importlib.util
    import os
    import sys

    def _installed_kernels():
        """The `kernels` package found on sys.path without this checkout's root, or None."""
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = [p for p in sys.path if os.path.abspath(p or os.curdir) != root]
        spec = importlib.machinery.PathFinder.find_spec("kernels", path)
        if spec is None or spec.loader is None:
            return None
        this = sys.modules["kernels"]
        module = importlib.util.module_from_spec(spec)
        sys.modules["kernels"] = module  # the import statement returns what sys.modules holds after this file ran
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules["kernels"] = this
            raise
        return module

    _installed_kernels()  # none installed: this stays an empty package of that name
