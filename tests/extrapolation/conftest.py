"""Fixtures of the extrapolation tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny shapes: one thread is fastest, and on a shared machine several threads spin."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
