"""Kernel tests run the Triton kernels through the interpreter when no GPU is present. The
variable must be set before triton is first imported, hence at conftest import time.

test.sh gives each worker one thread (two workers fill two cores); the kernels here take their thread
count from torch per call, so these tests raise it to at least two: the paths that split work across
threads (OpenMP loops, the lean step's own threads and barrier) run here on every machine."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

KERNEL_TEST_THREADS = 2


@pytest.fixture(autouse=True)
def _parallel_kernels():
    before = torch.get_num_threads()
    torch.set_num_threads(max(before, KERNEL_TEST_THREADS))
    yield
    torch.set_num_threads(before)
