"""Fused ops: Triton kernels registered as torch custom ops, each with an eager reference.

One folder per op family, each with the same files in the same order of dependency: kernels.py
(@triton.jit only) -> launch.py (host launcher) -> op.py (custom ops, autograd, the public
functional), beside reference.py (the eager oracle), cost.py (FLOPs and bytes) and __init__.py
(exports; registers the family's cost model and fix). Families share only _launch.py and
_dispatch.py, never each other's modules: norms/ (layer_norm, rms_norm, add_rms_norm), adamw/
(fusewise.optim.AdamW's step), linear_ce/ (linear_cross_entropy), gated/ (swiglu, geglu),
rotary/ (apply_rotary: the rotary position embedding of q and k).
"""

from . import adamw, gated, linear_ce, norms, reference, rotary
from ._dispatch import FusewiseFallbackError, paths
from .gated import geglu, swiglu
from .linear_ce import linear_cross_entropy
from .norms import add_rms_norm, layer_norm, rms_norm
from .rotary import apply_rotary

__all__ = [
    "layer_norm",
    "rms_norm",
    "add_rms_norm",
    "linear_cross_entropy",
    "swiglu",
    "geglu",
    "apply_rotary",
    "paths",
    "FusewiseFallbackError",
    "adamw",
    "gated",
    "linear_ce",
    "norms",
    "reference",
    "rotary",
]
