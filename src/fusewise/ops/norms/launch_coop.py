"""Host side of the cooperative forward (kernels_coop.py): its buffers and its launches."""

import torch

from .._launch import _I32_MAX, INTERPRETED, cdiv, launch
from . import kernels_coop as KC


def coop_pieces(coop, m: int, n: int, sms: int) -> int:
    """Pieces of a row of n under Coop setting `coop`, or 0 where the cooperative forward must
    not run: a row's pieces more than half the GPU's sms multiprocessors (0: no GPU, no limit),
    or tickets past int32. Half, not all: a row's pieces wait for each other, and other work
    on the GPU (another stream's kernels, NCCL's, an MPS share) can hold multiprocessors; each
    multiprocessor holds at least one program of at most 32 warps."""
    if coop.piece & (coop.piece - 1) or not 1 <= coop.warps <= 32 or coop.warps & (coop.warps - 1):
        raise ValueError(f"{coop}: the piece and the warps must be powers of two, warps <= 32")
    if coop.narrow and coop.piece < 2:  # its opaque step moves two 16-bit elements at a time
        raise ValueError(f"{coop}: a narrow piece must be 2 elements or more (settings.FWD_COOP)")
    if coop.registers and not 16 <= coop.registers <= 255:
        raise ValueError(f"{coop}: registers must be 0 (no cap) or 16-255 (settings.FWD_COOP)")
    pieces = cdiv(n, coop.piece)
    if (sms and 2 * pieces > sms) or m * pieces > _I32_MAX:
        return 0
    return pieces


def coop_forward(plan, tensors: tuple, eps: float, m: int, alloc) -> None:
    """Launch norm_fwd_coop_kernel for launch._forward_plan's `plan` on tensors (x, r, weight,
    bias, y, h, mean, rstd). On a GPU one launch, whose programs wait for their row's other
    pieces; under Triton's interpreter, which runs programs one at a time, two launches that do
    not wait (PHASE 1 then 2). The pieces' statistics and the counters are allocated here: the
    counters zeroed (a memset), the statistics (from `alloc`, launch.alloc) written before they
    are read."""
    x = tensors[0]
    pieces = plan.meta["PIECES"]
    part = alloc(m * pieces * 2, torch.float32, x.device)
    sync = torch.zeros(1 + m, dtype=torch.int32, device=x.device)
    args = (*tensors, part, sync, *plan.ints, eps)
    if x.is_cuda and not bool(INTERPRETED):
        launch(KC.norm_fwd_coop_kernel, plan.grid, *args, **plan.meta)
        return
    for phase in (1, 2):
        launch(KC.norm_fwd_coop_kernel, plan.grid, *args, PHASE=phase, **plan.meta)
