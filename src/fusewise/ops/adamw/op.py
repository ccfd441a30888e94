"""The fused AdamW step of one parameter group, the family's functional: the Triton kernel
(launch.py), one launch per bucket of tensors that share dtypes, alignment and device, or the
eager reference (reference.py) with a warning when the kernel cannot run (ops/_dispatch.py).

fusewise.optim.AdamW (the public API) keeps the state and calls step_group once per group. The
update equals torch.optim.AdamW's (kernels.py); its traffic is cost.py's, 28 B per parameter
in fp32 and in bf16 with fp32 masters. No host sync: the step counts live on the device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import _dispatch
from . import launch, reference


def kernel_can_run(*tensors: torch.Tensor) -> bool:
    """True when the Triton kernel runs on these tensors; else the caller runs the reference
    (choose_path has warned once, or raised under FUSEWISE_STRICT=1)."""
    return _dispatch.choose_path("adamw", *tensors) != _dispatch.REFERENCE


def step_group(
    params: list[torch.Tensor],
    states: list[dict],
    hyper: Callable[[torch.Tensor], dict],
    *,
    amsgrad: bool,
    grad_scale: torch.Tensor | None,
    found_inf: torch.Tensor | None,
    buckets: dict,
    key,
) -> None:
    """One AdamW update of every parameter in place (each has a .grad). states: torch's state
    per parameter (step already incremented, exp_avg, exp_avg_sq, max_exp_avg_sq with amsgrad,
    master_param with master weights), contiguous and on the parameter's device. hyper(p): lr,
    beta1, beta2, eps, weight_decay, maximize for p (lr on p's device). buckets: the caller's
    cache of launch.Bucket, kept under `key` (the group) and the bucket's dtypes and sizes."""
    if kernel_can_run(*params):
        _fused(params, states, hyper, amsgrad, grad_scale, found_inf, buckets, key)
        return
    for p, st in zip(params, states):
        reference.adamw_update(
            p,
            p.grad,
            st["exp_avg"],
            st["exp_avg_sq"],
            st.get("max_exp_avg_sq"),
            st.get("master_param"),
            st["step"],
            **hyper(p),
            grad_scale=grad_scale,
            found_inf=found_inf,
        )


def _fused(params, states, hyper, amsgrad, grad_scale, found_inf, buckets, key):
    by_layout: dict[tuple, list[int]] = {}
    rows = [_table_row(p, st) for p, st in zip(params, states)]
    for i, (p, st, row) in enumerate(zip(params, states, rows)):
        master = "master_param" in st
        # every pointer the kernel takes as 16-byte aligned (0, an absent one, is)
        aligned = all(ptr % 16 == 0 for ptr in row[1:7])
        layout = (p.dtype, p.grad.dtype, st["exp_avg"].dtype, master, aligned, p.device)
        by_layout.setdefault(layout, []).append(i)
    for layout, idx in by_layout.items():
        p_dtype, g_dtype, s_dtype, master, aligned, device = layout
        cache_key = (key, layout, tuple(params[i].numel() for i in idx))
        bucket = buckets.get(cache_key)
        if bucket is None:
            bucket = buckets[cache_key] = launch.Bucket([params[i].numel() for i in idx])
        launch.launch(
            bucket,
            [rows[i] for i in idx],
            device,
            p_dtype=p_dtype,
            g_dtype=g_dtype,
            s_dtype=s_dtype,
            **hyper(params[idx[0]]),
            amsgrad=amsgrad,
            master=master,
            grad_scale=grad_scale,
            found_inf=found_inf,
            aligned=aligned,
        )


def _table_row(p, st) -> tuple[int, ...]:
    """The kernel's table row of one parameter (launch.TABLE_COLS columns; 0 for an absent
    tensor)."""
    vmax = st.get("max_exp_avg_sq")
    master = st.get("master_param")
    return (
        p.numel(),
        p.data_ptr(),
        p.grad.data_ptr(),
        st["exp_avg"].data_ptr(),
        st["exp_avg_sq"].data_ptr(),
        vmax.data_ptr() if vmax is not None else 0,
        master.data_ptr() if master is not None else 0,
        st["step"].data_ptr(),
    )
