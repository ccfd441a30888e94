"""Eager PyTorch oracles: the single source of truth for what each fused op computes, gathered
from the families (norms/, adamw/, linear_ce/, gated/, rotary/ reference.py) under one importable
name.

Tests compare kernels with these in float64, benchmarks time them as the "naive eager" provider,
and the CPU path runs them (with a warning) when the Triton kernel cannot run. torch only.
"""

from .adamw.reference import adamw_update
from .gated.reference import geglu, swiglu
from .linear_ce.reference import linear_cross_entropy
from .norms.reference import add_rms_norm, layer_norm, norm_backward, norm_forward, rms_norm
from .rotary.reference import apply_rotary

__all__ = [
    "layer_norm",
    "rms_norm",
    "add_rms_norm",
    "norm_forward",
    "norm_backward",
    "adamw_update",
    "linear_cross_entropy",
    "swiglu",
    "geglu",
    "apply_rotary",
]
