"""Decode step time through the Program (and the transformers baseline): see ninfer/bench/decode.py.

    PYTHONPATH=$PWD python bench/decode.py [flags]      (same as `ninfer bench decode [flags]`)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ninfer.bench.decode import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
