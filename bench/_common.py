"""Shared helpers of the bench/*.py scripts: they live in the installable package (ninfer/bench/common.py)."""
from ninfer.bench.common import (DOC_COPY_TBS, DOC_GEMV_TBS, DOC_MATMUL_TFLOPS, bench_ms, env_record,  # noqa: F401
                                 json_line, measure_ceilings, print_ceilings, print_table)
