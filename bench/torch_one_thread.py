"""Imported first by the PyTorch baselines (torch_layer_bench.py, torch_decode_bench.py): runs the
script in PyTorch's best single-thread configuration and makes tests/reference importable.

OPENBLAS_NUM_THREADS=1, OMP_NUM_THREADS=1, MKL_NUM_THREADS=1, and MALLOC_MMAP_MAX_=0 so large
tensors reuse heap pages instead of faulting in fresh mmap pages every call. The environment must
be set before torch loads, so importing this module re-executes the script once with it.
"""
import os
import sys

ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "MALLOC_MMAP_MAX_": "0"}
if any(os.environ.get(k) != v for k, v in ENV.items()):
    os.environ.update(ENV)
    os.execv(sys.executable, [sys.executable] + sys.argv)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
