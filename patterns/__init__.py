"""Matchers that find rel-pos attention in an FX graph, however it is written (installed as ``samhq_fx.patterns``)."""
