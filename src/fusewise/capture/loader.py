"""Which lines of the user's code pull batches from a DataLoader: while active, every
`__next__` of a DataLoader iterator is counted under the calling line, so a data-loading
finding (found on the GPU timeline, which has no Python stacks) can name where the wait is."""

from __future__ import annotations

import collections
import contextlib

from torch.utils.data import dataloader

from .opgraph import user_line


@contextlib.contextmanager
def loader_lines():
    """with loader_lines() as lines: ...  -> lines: Counter of 'path:line' -> batches taken."""
    lines: collections.Counter = collections.Counter()
    original = dataloader._BaseDataLoaderIter.__next__

    def counted(self):
        lines[user_line()] += 1
        return original(self)

    dataloader._BaseDataLoaderIter.__next__ = counted
    try:
        yield lines
    finally:
        dataloader._BaseDataLoaderIter.__next__ = original
