"""Triton kernels for decomposed rel-pos attention (installed as ``samhq_fx.kernels``)."""
