"""Kernel bench (every fast op vs its PyTorch reference at the 27B shapes): see ninfer/bench/kernels.py.

    PYTHONPATH=$PWD python bench/kernels.py [--quick] [--out DIR]      (same as `ninfer bench kernels`)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ninfer.bench.kernels import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
