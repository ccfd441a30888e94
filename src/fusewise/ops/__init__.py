"""Fused ops: Triton kernels registered as torch custom ops, each with an eager reference."""

from ._dispatch import FusewiseFallbackError, paths
from .layer_norm import layer_norm
from .linear_cross_entropy import linear_cross_entropy
from .rms_norm import add_rms_norm, rms_norm

__all__ = [
    "layer_norm",
    "rms_norm",
    "add_rms_norm",
    "linear_cross_entropy",
    "paths",
    "FusewiseFallbackError",
]
