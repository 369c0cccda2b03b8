"""Kernel tests run the Triton kernels through the interpreter when no GPU is present. The
variable must be set before triton is first imported, hence at conftest import time."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
