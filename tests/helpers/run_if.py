"""One skip decorator for tests that need hardware this machine may not have."""

from __future__ import annotations

import pytest
import torch


def requires_gpus(count: int = 1):
    """Run the test only where at least ``count`` CUDA GPUs are visible (skipped, saying why, elsewhere); marked
    ``gpu``, so ``pytest -m gpu`` runs the GPU tests alone."""
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    skip = pytest.mark.skipif(available < count, reason=f"needs {count} CUDA GPU(s), this machine has {available}")

    def mark(test):
        return pytest.mark.gpu(skip(test))

    return mark
