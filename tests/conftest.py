"""Test device: the GPU when there is one, else the CPU with Triton's interpreter running the real
kernels. TRITON_INTERPRET must be set before any kernel is decorated, so this runs first."""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Kernel outputs start as NaN (floats) so an element a kernel never writes fails the test."""
    from fusewise.ops.norms import launch as norm_launch

    def alloc(shape, dtype, device):
        return torch.full(
            shape if isinstance(shape, tuple) else (shape,),
            float("nan"),
            dtype=dtype,
            device=device,
        )

    monkeypatch.setattr(norm_launch, "alloc", alloc)


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
