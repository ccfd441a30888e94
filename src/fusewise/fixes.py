"""The fix a finding points at, keyed by (kind, pattern).

Op families fill this when they are imported (`ops/<family>/__init__.py` calls `register`), so a
new fused op makes the diagnosis recommend it without an analyzer changing; the generic fixes
(a torch setting, a change to the user's code) are written here once. Analyzers ask `text(kind,
pattern)` and never write a fix themselves. Imports nothing from fusewise: every layer may use it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fix:
    text: str  # what to do, in words a user can act on
    api: str | None = None  # the fusewise call that does it, when there is one
    origin: str = "generic"  # the op family that registered it


# (kind, pattern) -> the fix that does not need fusewise's kernels; pattern None = any pattern
_GENERIC: dict[tuple[str, str | None], str] = {
    ("fusion-chain", "norm"): "torch.compile the norm",
    ("fusion-chain", "optimizer"): "torch.optim.AdamW(fused=True)",
    ("fusion-chain", "cross-entropy"): "torch.compile the loss",
    ("fusion-chain", "grad-clip"): (
        "torch.nn.utils.clip_grad_norm_(..., foreach=True) (one _foreach_norm and one "
        "_foreach_mul_ over all gradients; its default on CUDA tensors only), or "
        "torch.compile the gradient processing"
    ),
    ("fusion-chain", "attention"): (
        "torch.nn.functional.scaled_dot_product_attention (flash / memory-efficient)"
    ),
    (
        "fusion-chain",
        "elementwise",
    ): "torch.compile the function (Inductor fuses elementwise chains)",
    ("fusion-chain", "rotary"): (
        "torch.compile the rotary application (q * cos + rotate_half(q) * sin, and k's: "
        "Inductor makes it one kernel forward and one backward)"
    ),
    ("fusion-chain", "gated-activation"): (
        "torch.compile the MLP's activation, act(gate) * up (Inductor makes it one kernel "
        "forward and one backward)"
    ),
    ("fusion-chain", "other"): "torch.compile the function, or a custom fused kernel",
    ("quadratic-memory", None): (
        "scaled_dot_product_attention keeps attention linear in memory; check it runs a flash or "
        "memory-efficient backend (no explicit mask, supported dtype and head dim)"
    ),
    ("attention-fallback", None): (
        "make a fused backend possible (or remove a call inside torch.nn.attention.sdpa_kernel "
        "that forces the math backend); run once under sdpa_kernel(SDPBackend.FLASH_ATTENTION) "
        "or EFFICIENT_ATTENTION to have torch say why it refuses"
    ),
    ("host-sync", None): (
        "keep the value on the GPU (log it every N steps, accumulate with torch ops, use "
        "torch.where instead of `if`), or copy with non_blocking=True into pinned memory"
    ),
    ("launch-overhead", None): (
        "capture the step in a CUDA graph (torch.compile(mode='reduce-overhead'), "
        "torch.cuda.graphs), or fuse the small ops so there are fewer launches"
    ),
    ("data-loading", None): (
        "DataLoader(num_workers > 0, pin_memory=True, persistent_workers=True), prefetch the next "
        "batch, or move preprocessing onto the GPU"
    ),
    ("idle-gap", None): (
        "move host work off the step's critical path (another thread, fewer Python loops per "
        "step) or overlap it with GPU work"
    ),
    ("matmul-precision", "tf32"): (
        'torch.set_float32_matmul_precision("high") once, before the model runs (fp32 matmuls '
        'run as TF32); or, the bigger saving, run forward and loss under torch.autocast("cuda", '
        "dtype=torch.bfloat16)"
    ),
    ("matmul-precision", "autocast"): (
        'run forward and loss under torch.autocast("cuda", dtype=torch.bfloat16) (fp32 master '
        "weights and optimizer stay as they are)"
    ),
    ("matmul-shape", "align"): (
        "pad the dimension to the multiple shown (e.g. the vocabulary 50257 -> 50304, the extra "
        "rows never targeted), or choose hidden / head sizes that are multiples of 64"
    ),
    ("matmul-shape", "tiny"): (
        "batch the small matmuls into one (torch.bmm / a stacked weight), or capture the loop in "
        "a CUDA graph (torch.cuda.graphs, torch.compile(mode='reduce-overhead'))"
    ),
    ("host-sync", "explicit-sync"): (
        "remove explicit synchronisation from the step (torch.cuda.synchronize, blocking "
        "copies); keep values on the GPU"
    ),
}

_REGISTERED: dict[tuple[str, str | None], list[Fix]] = {}


def register(kind: str, pattern: str | None, text: str, *, api: str, origin: str) -> None:
    """An op family's fix for findings of `kind` (and `pattern`): listed before the generic fix.
    Registering the same fix twice (a module imported again) keeps one."""
    fix = Fix(text, api, origin)
    found = _REGISTERED.setdefault((kind, pattern), [])
    if fix not in found:
        found.append(fix)


def registered(kind: str, pattern: str | None = None) -> list[Fix]:
    """fusewise's own fixes for (kind, pattern), in the order the families registered them."""
    return list(_REGISTERED.get((kind, pattern), ()))


def text(kind: str, pattern: str | None = None) -> str:
    """The fix of a finding, in words: fusewise's own fixes first, then the generic one."""
    parts = [f.text for f in registered(kind, pattern)]
    generic = _GENERIC.get((kind, pattern)) or _GENERIC.get((kind, None))
    if generic:
        parts.append(generic)
    if not parts:
        raise KeyError(f"no fix known for a {kind!r} finding (pattern {pattern!r})")
    return "; or ".join(parts)
