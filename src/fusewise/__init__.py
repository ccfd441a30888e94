"""fusewise: find, fix and verify the memory traffic a PyTorch step does not need."""

__version__ = "0.1.0"

from . import cost, hardware, nn, ops, optim  # noqa: E402

__all__ = ["ops", "nn", "optim", "hardware", "cost", "__version__"]
