"""End-to-end serving benchmark through the OpenAI API (`ninfer serve --load-format dummy`):
see ninfer/bench/serve.py.

    PYTHONPATH=$PWD python bench/serve.py [flags]      (same as `ninfer bench serve [flags]`)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ninfer.bench.serve import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
