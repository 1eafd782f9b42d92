"""The tuning tables (`ninfer/ops/configs/*.json`) and their loader (`ninfer.ops.tuning`), on the CPU."""
from __future__ import annotations

import json

import pytest

from ninfer.ops import tuning
from support.bench_scripts import load_bench_script


def test_device_kind_without_cuda_is_default():
    assert tuning.device_kind("cpu") == "default"


@pytest.mark.parametrize("name", ["gemv", "moe_decode"])
def test_shipped_tables_load(name):
    data = tuning.read_table_file(tuning.table_path(name))
    assert "default" in data
    assert tuning.load_entry(name, "no-such-device") == data["default"]


def test_shipped_gemv_table_is_well_formed():
    entry = tuning.load_entry("gemv", "default")
    fields = {"block_n", "block_k", "split_k", "num_warps", "num_stages", "dot", "prefetch"}
    keys = set(entry["configs"])
    assert keys and all(set(cfg) == fields for cfg in entry["configs"].values())
    assert set(entry["triton"]) <= keys and set(entry["swiglu"]) <= keys
    assert all(int(k.split("x")[2]) in (1, 2, 4, 8) for k in keys)


def test_shipped_moe_decode_table_is_well_formed():
    entry = tuning.load_entry("moe_decode", "default")
    fields = {"up_bn", "up_bk", "up_warps", "down_bn", "down_bk", "down_warps"}
    assert set(entry["one_token"]) == fields and set(entry["many_tokens"]) == fields
    assert entry["many_from"] >= 2


def test_write_entry_keeps_the_other_kinds(tmp_path):
    path = tmp_path / "t.json"
    tuning.write_entry(path, "default", {"a": 1})
    tuning.write_entry(path, "gpu-x", {"a": 2, "rows": {"1x2x1": {"b": True}}})
    tuning.write_entry(path, "default", {"a": 3})
    assert json.loads(path.read_text()) == {"default": {"a": 3}, "gpu-x": {"a": 2, "rows": {"1x2x1": {"b": True}}}}
    assert tuning.load_entry("t", "gpu-x", path=path)["a"] == 2
    assert tuning.load_entry("t", "gpu-y", path=path)["a"] == 3


@pytest.mark.parametrize("text, match", [
    ("not json", "not a readable JSON"),
    ("[1, 2]", "maps device kinds"),
    ('{"default": 3}', "maps device kinds"),
    ('{"gpu-x": {}}', "no \"default\" entry"),
])
def test_malformed_table_files_are_refused_by_name(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as e:
        tuning.load_entry("bad", "default", path=path)
    assert "bad.json" in str(e.value)


def test_a_missing_table_file_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="missing.json"):
        tuning.read_table_file(tmp_path / "missing.json")


def test_gemv_bench_writes_a_table_that_loads(tmp_path):
    """bench/gemv.py's --out path: swept shapes update the entry (config, Triton and SwiGLU marks both
    ways), other shapes keep theirs, and the file loads back through the kernel's parser."""
    pytest.importorskip("triton")
    from ninfer.ops.triton import gemv_configs as gc
    bench = load_bench_script("gemv")
    results = [{"N": 5120, "K": 6144, "M": 1, "best": [8, 1024, 1, 4, 1, False, True], "speedup": 1.2},
               {"N": 2048, "K": 512, "M": 1, "best": [8, 512, 1, 4, 1, False, False], "speedup": 1.0},
               {"N": 96, "K": 256, "M": 3, "best": [16, 128, 1, 4, 1, False, False], "speedup": 1.5},
               {"N": 64, "K": 64, "M": 1, "best": None, "speedup": None}]
    swiglu = [{"N": 5120, "K": 17408, "M": 1, "fold": False}, {"N": 5120, "K": 17408, "M": 2, "fold": True}]
    args = bench.parse_args(["--out", str(tmp_path / "gemv.json"), "--kind", "gpu-x", "--m", "1"])
    assert bench.write_table(args, results, swiglu) == f"{tmp_path / 'gemv.json'} [gpu-x]"
    t = gc.parse_tables(tuning.load_entry("gemv", "gpu-x", path=tmp_path / "gemv.json"))
    default = gc.load_tables("default")
    assert t.configs[(5120, 6144, 1)] == gc.GemvConfig(8, 1024, 1, 4, 1, False, True) and (5120, 6144, 1) in t.triton
    assert (2048, 512, 1) not in t.triton and (2048, 512, 1) in default.triton
    assert (96, 256, 3) not in t.configs and (64, 64, 1) not in t.configs
    assert t.swiglu == {(5120, 17408, 2)}
    assert t.configs[(248320, 5120, 8)] == default.configs[(248320, 5120, 8)]
    assert gc.parse_tables(tuning.load_entry("gemv", "default", path=tmp_path / "gemv.json")) == default


def test_malformed_kernel_entries_are_refused():
    pytest.importorskip("triton")
    from ninfer.ops.triton import gemv_configs as gc, moe_decode as md
    with pytest.raises(ValueError, match="row bucket"):
        gc.parse_tables({"configs": {}, "triton": ["96x256x3"]})
    with pytest.raises(ValueError, match="gemv tuning entry"):
        gc.parse_tables({"configs": {"96x256x4": {"block_m": 1}}, "triton": []})
    with pytest.raises(ValueError, match="moe_decode tuning entry"):
        md.parse_table({"one_token": {}})
    t = md.parse_table(tuning.load_entry("moe_decode", "default"))
    assert md.decode_config(1) == t.one_token and md.decode_config(t.many_from) == t.many_tokens


def test_moe_decode_bench_dry_run():
    """bench/moe_decode.py parses its arguments and prints its plan and the table entry without a GPU."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, str(root / "bench" / "moe_decode.py"), "--dry-run", "--sweep",
                        "--configs", "1,512,4,2,512,4;2,256,8,1,512,1"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "E=256 k=8 H=2048 I=512" in r.stdout and "2 configs" in r.stdout and '"many_from": 2' in r.stdout
    r = subprocess.run([sys.executable, str(root / "bench" / "moe_decode.py"), "--configs", "1,2,3"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "6 fields" in r.stderr


def test_moe_decode_bench_table_entry(tmp_path):
    """one_token: the fastest "new" tiles at T=1; many_tokens: the least total over T >= many_from among the
    tiles timed at every such T; the written file loads through the kernel's parser."""
    bench = load_bench_script("moe_decode")
    base = tuning.load_entry("moe_decode", "default")
    a, b, c = [1, 512, 4, 2, 512, 4], [2, 256, 8, 1, 512, 1], [4, 128, 4, 1, 256, 2]

    def row(T, times):
        return {"T": T, "sweep": [{"config": cfg, "path": "new", "us": us} for cfg, us in times]
                + [{"config": a, "path": "split", "us": 0.1}]}
    results = [row(1, [(a, 30.0), (b, 25.0)]), row(2, [(a, 40.0), (b, 50.0), (c, 1.0)]),
               row(4, [(a, 70.0), (b, 55.0)])]
    entry = bench.table_entry(base, results)
    assert entry["one_token"] == dict(zip(bench.FIELDS, b)) and entry["many_tokens"] == dict(zip(bench.FIELDS, b))
    assert entry["many_from"] == base["many_from"]
    assert bench.table_entry(base, []) == base
    pytest.importorskip("triton")
    args = argparse_namespace(out=str(tmp_path / "moe.json"), kind="gpu-x")
    assert bench.write_table(args, results).endswith("[gpu-x]")
    from ninfer.ops.triton.moe_decode import parse_table
    t = parse_table(tuning.load_entry("moe_decode", "gpu-x", path=tmp_path / "moe.json"))
    assert list(t.one_token) == b and t.many_from == base["many_from"]


def argparse_namespace(**kw):
    import argparse
    return argparse.Namespace(**kw)
