"""Shared pytest configuration and fixtures of the whole suite (tests/unit, tests/integration, tests/gpu).
Shared helpers that are not fixtures live in the `support` package (tests/support/, on the path:
`from support.program_util import tiny_parts`); a test file never imports another test file.

Which tests a run collects
    Without CUDA, tests/gpu/ is not collected (and a `gpu`-marked test outside it would be deselected),
    so the CPU run (`bash .ci/run`) neither runs nor skips the GPU suite. It is collected where it can
    run: with CUDA (`python3 -m pytest -m gpu tests/gpu`; bench/gpu_suite.sh on a device machine),
    or in the Triton interpreter mode (TRITON_INTERPRET=1 NINFER_FAST_TEST_DEVICE=cpu, see
    support/fast_env.py). Naming tests/gpu or a file in it on the command line always collects it
    (without CUDA its tests then report as skipped).

Threads
    Without CUDA, or under pytest-xdist, torch runs one intra-op CPU thread in every test process
    (see pytest_configure); CLI and server subprocesses get OMP_NUM_THREADS=1 (support.serve_util.
    cli_env). Run the suite in parallel: `python3 -m pytest -q -n 2 --dist loadfile tests` (whole
    files per worker, so that a module's fixtures are built once).

Fixtures (session-scoped; each is built once a run, ~1-2 s a build, by the first pytest-xdist worker that
asks for it, in a folder all workers read: tests must not write into them; copy first)
    tiny_artifact_path(kind, dtype="bf16", *, layout="official", seed=0) -> Path of a tiny .ninfer file
    tiny_checkpoint_dir(kind, layout="official", *, seed=0) -> HF checkpoint dir incl. tokenizer files
        (hard links to one copy: never write into them)

    def test_something(tiny_artifact_path):
        path = tiny_artifact_path("dense")                 # -> Path of a .ninfer file
        path = tiny_artifact_path("moe", dtype="fp32")     # dtype "bf16" (default) | "fp32"
        with ninfer.artifact.open_artifact(path) as art: ...

    def test_other(tiny_checkpoint_dir):
        src = tiny_checkpoint_dir("moe", "official")       # HF checkpoint dir incl. tokenizer files

  kind    "dense" (identity qwen3_6-tiny-dense) | "moe" (qwen3_6-tiny-moe)
  layout  "official" (default for artifacts: multimodal names, vision tower, MTP, fused MoE
          main experts) | "vl" | "text" (no vision group). All layouts carry `mtp.*`.
  seed    0 by default. The weights equal those of
          `ninfer.testing.tiny_hf.build_hf_model(kind, "vl" or "text", seed=seed)` (same seed),
          so that HF model is the reference for parity tests. NOTE: "vl" and "text" builds of
          the same seed draw different random weights: compare a "text"-layout artifact with
          `build_hf_model(kind, "text")`, any other layout with the "vl" model.
  dtype   The checkpoints are stored BF16 like the official ones (`linear_attn.A_log` /
          `linear_attn.norm.weight` F32, as the 35B-A3B stores them), and build_hf_model rounds its
          parameters to the same bf16 values: the HF model, a bf16 artifact and an fp32 artifact all
          hold identical numbers, and a CPU Program computes in fp32 from either. The bf16 default
          halves the file (~75 MB instead of ~140 MB, mostly the 248k-row embedding and LM head); ask
          for "fp32" only where a test is about fp32 storage. The dense kind's "official" layout is its
          "vl" layout (nothing to fuse): both names give one checkpoint and one artifact.

Disk: the suite's temporary files stay under 1 GB at their peak (tests/unit/test_suite_disk.py). A module
fixture that writes a model file of its own builds it in `support.scratch.scratch_dir`, removed when the
module ends; a test that needs a variant of a tiny checkpoint (sharded, F32) writes it in its tmp_path.

The artifacts hold the real Qwen3.6 tokenizer files (frontend `write_tokenizer_files`).
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parent / "gpu"


@functools.lru_cache(maxsize=None)
def _runs_gpu_tests() -> bool:
    """True where the `gpu` tests can run: CUDA, or the Triton interpreter on the CPU (support/fast_env.py)."""
    if os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("NINFER_FAST_TEST_DEVICE") == "cpu":
        return True
    import torch
    return torch.cuda.is_available()


def _named_on_the_command_line(config: pytest.Config, folder: Path) -> bool:
    """Whether an argument of this run is `folder` or lies inside it (a file, a node id)."""
    for arg in config.args:
        p = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if p == folder or folder in p.parents:
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    # NOTE: one intra-op thread for torch on the CPU (not on a CUDA machine run serially, whose CPU
    #       references may be large). The tiny models' ops are too small to gain from more, and where the
    #       cores are shared (pytest-xdist workers, the CLI and server subprocesses, other jobs) extra
    #       threads wait on each other: the same parity test ran over ten times longer.
    import torch
    if os.environ.get("PYTEST_XDIST_WORKER") or not torch.cuda.is_available():
        torch.set_num_threads(1)
        # and in every subprocess a test starts (bench scripts, `ninfer bench serve`'s server, CLI runs that
        # do not go through support.serve_util.cli_env), which inherit this environment
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    # NOTE: pytest-xdist hands out whole files in collection order (LONG_FILES first, below), not sorted by
    #       their number of tests, which would put the long files with few tests last.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.resolve() == GPU_DIR and not _runs_gpu_tests() \
            and not _named_on_the_command_line(config, GPU_DIR):
        return True
    return None


# The files that take longest (each 15-40 s of one worker on 2 cores), run first: pytest-xdist's
# `--dist loadfile` hands whole files to workers in collection order, so a long file collected last
# keeps one worker busy while the other has finished.
LONG_FILES = (
    "integration/test_bench_cli.py", "integration/test_serve_e2e.py", "integration/test_constrained_engine.py",
    "integration/test_scoring.py", "unit/qwen3_6/test_speculative_program.py",
    "integration/test_prefix_reuse_output_boundary.py", "integration/test_serve_tools.py",
    "integration/test_model_parity.py", "unit/artifact/test_convert.py", "integration/test_vision_parity.py",
    "integration/test_playground.py", "integration/test_cli_gateway.py",
)


def _long_first(item: pytest.Item) -> int:
    path = item.path.as_posix()
    return next((i for i, name in enumerate(LONG_FILES) if path.endswith("tests/" + name)), len(LONG_FILES))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_long_first)               # stable: the order within a file and among the rest is kept
    if _runs_gpu_tests():
        return
    gpu = [it for it in items if it.get_closest_marker("gpu") is not None and GPU_DIR not in it.path.parents]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [it for it in items if it.get_closest_marker("gpu") is None or GPU_DIR in it.path.parents]


def _run_shared_dir(tmp_path_factory) -> Path:
    """A folder of this run that every pytest-xdist worker sees: the controller's base temp (the workers'
    own base temps lie inside it), else this process's base temp."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    shared = base / "shared"
    shared.mkdir(exist_ok=True)
    return shared


def _build_once(shared: Path, name: str, build) -> Path:
    """shared/<name>, built by `build(tmp_dir)` by the first process that asks for it (an exclusive file
    lock per name keeps the other workers waiting), then renamed into place so it is whole or absent."""
    import fcntl
    import shutil

    out = shared / name
    with open(shared / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            tmp = shared / f".{name}.{os.getpid()}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            build(tmp)
            tmp.rename(out)
    return out


def _same_tensors_layout(kind: str, layout: str) -> str:
    """The dense kind has no MoE experts to fuse, so its "official" layout writes the "vl" layout's
    tensors: both names share one build."""
    return "vl" if kind == "dense" and layout == "official" else layout


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_in_the_run_folder(tmp_path_factory):
    """What the suite writes through `tempfile` (server logs, `ninfer bench` output folders, libraries'
    caches), in this process and in the subprocesses it starts (TMPDIR), goes under this run's base
    folder, which pytest removes after a passing run. The test cache (support.serve_util.shared_cache_dir:
    the demo model and the tokenizer, reused by the next run) stays where TMPDIR pointed before."""
    import tempfile
    os.environ.setdefault("NINFER_TEST_CACHE_ROOT", tempfile.gettempdir())
    folder = tmp_path_factory.getbasetemp() / "tmp"
    folder.mkdir(exist_ok=True)
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(folder), str(folder)
    try:
        yield folder
    finally:
        tempfile.tempdir = saved[1]
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]


@pytest.fixture(scope="session")
def tiny_checkpoint_dir(tmp_path_factory):
    cache: dict[tuple, Path] = {}
    shared = _run_shared_dir(tmp_path_factory)

    def get(kind: str, layout: str = "official", *, seed: int = 0) -> Path:
        layout = _same_tensors_layout(kind, layout)
        key = (kind, layout, seed)
        if key not in cache:
            from ninfer.targets.qwen3_6.frontend.vocab import write_tokenizer_files
            from ninfer.testing.tiny_hf import write_tiny_checkpoint

            tokenizer = _build_once(shared, "tokenizer", write_tokenizer_files)

            def build(out: Path) -> None:
                write_tiny_checkpoint(out, kind, layout, seed=seed)
                for f in tokenizer.iterdir():          # hard links: one copy of the 15 MB of tokenizer files
                    os.link(f, out / f.name)

            cache[key] = _build_once(shared, f"hf-{kind}-{layout}-s{seed}", build)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def tiny_artifact_path(tmp_path_factory, tiny_checkpoint_dir):
    cache: dict[tuple, Path] = {}
    shared = _run_shared_dir(tmp_path_factory)

    def get(kind: str, dtype: str = "bf16", *, layout: str = "official", seed: int = 0) -> Path:
        layout = _same_tensors_layout(kind, layout)
        key = (kind, dtype, layout, seed)
        if key not in cache:
            from ninfer.convert import convert

            src = tiny_checkpoint_dir(kind, layout, seed=seed)
            name = f"tiny-{kind}-{layout}-{dtype}-s{seed}"
            folder = _build_once(shared, name, lambda out: convert(src, out / f"{name}.ninfer", dtype=dtype))
            cache[key] = folder / f"{name}.ninfer"
        return cache[key]

    return get
