"""Benchmarks. `python -m bench` runs the engine side by side with HF transformers and the machine's
own limits (see docs/BENCHMARKS.md); gpu_kernels.py and block_manager_micro.py are separate tools."""
