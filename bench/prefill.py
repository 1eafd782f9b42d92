"""Prefill TTFT and throughput through the Program (1k/8k/32k): see ninfer/bench/prefill.py.

    PYTHONPATH=$PWD python bench/prefill.py [flags]      (same as `ninfer bench prefill [flags]`)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ninfer.bench.prefill import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
