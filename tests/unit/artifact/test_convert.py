"""Converter: every HF layout converts and reads back bit for bit; every bad checkpoint is rejected
with a message naming the problem and leaves no output file."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer.artifact import open_artifact
from ninfer.convert import ConvertError, convert
from ninfer.targets.qwen3_6.schema import FP32_KEEP_SUFFIXES

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_EXPERT = re.compile(r"^(.+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _source_tensors(src: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(src.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _expected(src: Path, dtype: str) -> dict[str, torch.Tensor]:
    """The oracle, written independently of the converter: rename, fuse per-expert, cast."""
    raw = _source_tensors(src)
    canon, experts = {}, {}
    for k, v in raw.items():
        for old, new in (("model.language_model.", ""), ("model.visual.", "visual."), ("model.", "")):
            if k.startswith(old):
                k = new + k[len(old):]
                break
        m = _EXPERT.match(k)
        if m:
            experts.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = v
        else:
            canon[k] = v
    for p, ex in experts.items():
        canon[p + ".gate_up_proj"] = torch.stack([torch.cat([ex[e]["gate_proj"], ex[e]["up_proj"]]) for e in sorted(ex)])
        canon[p + ".down_proj"] = torch.stack([ex[e]["down_proj"] for e in sorted(ex)])
    out = {}
    for k, v in canon.items():
        keep = v.dtype == torch.float32 and k.endswith(FP32_KEEP_SUFFIXES)
        out[k] = v if keep else v.to(DTYPES[dtype])
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _no_leftovers(directory: Path, out: Path) -> None:
    assert not out.exists()
    assert [p.name for p in directory.iterdir() if p.name.endswith(".partial")] == []


def _sharded(src: Path, dst: Path, shards: int) -> Path:
    """A copy of the one-file checkpoint `src` whose tensors are split over `shards` files and an index."""
    from ninfer.testing.tiny_hf import save_safetensors

    dst.mkdir()
    for p in src.iterdir():
        if p.suffix != ".safetensors":
            shutil.copyfile(p, dst / p.name)
    save_safetensors(_source_tensors(src), dst, shards)
    return dst


def test_roundtrip_of_an_fp32_source(tmp_path):
    """An all-F32 source (the shared tiny checkpoints are BF16): fp32 keeps it, bf16 rounds it. (Defined
    before the tests that build the module's per-expert checkpoint: the two never share the disk.)"""
    from ninfer.targets.qwen3_6.frontend.vocab import write_tokenizer_files
    from ninfer.testing.tiny_hf import write_tiny_checkpoint

    src = write_tiny_checkpoint(tmp_path / "src", "dense", "text", dtype="fp32")
    write_tokenizer_files(src)
    assert {t.dtype for t in _source_tensors(src).values()} == {torch.float32}
    for dtype in ("bf16", "fp32"):
        out = tmp_path / f"{dtype}.ninfer"
        _check_roundtrip(src, out, "dense", "text", dtype)
        out.unlink()                    # disk: one 140 MB output at a time


@pytest.fixture(scope="module")
def moe_per_expert(tmp_path_factory):
    """The MoE checkpoint in the "vl" layout (per-expert main experts, as `save_pretrained` writes them):
    only this module reads it, so it is built here and removed when the module ends rather than kept
    in the session's shared folder."""
    from ninfer.targets.qwen3_6.frontend.vocab import write_tokenizer_files
    from ninfer.testing.tiny_hf import write_tiny_checkpoint
    from support.scratch import scratch_dir

    with scratch_dir(tmp_path_factory, "hf-moe-vl") as d:
        write_tiny_checkpoint(d, "moe", "vl")
        write_tokenizer_files(d)
        yield d


def _checkpoint(request, kind: str, layout: str) -> Path:
    if (kind, layout) == ("moe", "vl"):
        return request.getfixturevalue("moe_per_expert")
    return request.getfixturevalue("tiny_checkpoint_dir")(kind, layout)


CASES = [("dense", "text", 1), ("moe", "text", 1), ("dense", "vl", 1), ("moe", "vl", 1),
         ("dense", "official", 3), ("moe", "official", 3), ("moe", "official", 1)]


@pytest.mark.parametrize("kind,layout,shards", CASES)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_roundtrip_bit_exact(request, tmp_path, kind, layout, shards, dtype):
    src = _checkpoint(request, kind, layout)
    if shards > 1:
        src = _sharded(src, tmp_path / "src", shards)
    assert (src / "model.safetensors.index.json").exists() == (shards > 1)
    # BF16 as in the official checkpoints; A_log / GDN norm F32 as in the 35B-A3B
    assert {t.dtype for t in _source_tensors(src).values()} == {torch.bfloat16, torch.float32}
    _check_roundtrip(src, tmp_path / "m.ninfer", kind, layout, dtype)


def _check_roundtrip(src: Path, out: Path, kind: str, layout: str, dtype: str) -> None:
    out = convert(src, out, dtype=dtype)
    expected = _expected(src, dtype)
    with open_artifact(out, verify=True) as art:
        assert art.identity == f"qwen3_6-tiny-{kind}"
        assert sorted(art.tensor_names()) == sorted(expected)
        assert art.has_group("mtp") and art.has_group("vision") == (layout != "text")
        for name, want in expected.items():
            got = art.tensor(name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert torch.equal(_bits(got), _bits(want)), name
        if dtype == "bf16":  # norm/A_log are F32 in every tiny source and stay fp32; everything else is bf16
            assert art.tensor("layers.0.linear_attn.A_log").dtype == torch.float32
            assert art.tensor("layers.0.linear_attn.norm.weight").dtype == torch.float32
            assert art.tensor("layers.0.input_layernorm.weight").dtype == torch.bfloat16
        res = art.frontend_resources()
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
            assert res[name] == (src / name).read_bytes()
        assert art.eos_token_ids == (248046, 248044)
        prov = {f["name"]: f for f in art.descriptor["source"]["files"]}
        assert prov["config.json"]["size"] == (src / "config.json").stat().st_size
        assert len(prov["config.json"]["sha256"]) == 64


def test_per_expert_and_fused_layouts_give_identical_payloads(moe_per_expert, tiny_checkpoint_dir, tmp_path):
    a = convert(moe_per_expert, tmp_path / "a.ninfer", dtype="bf16")        # bf16: half the disk, same check
    b = convert(tiny_checkpoint_dir("moe", "official"), tmp_path / "b.ninfer", dtype="bf16")
    with open_artifact(a) as x, open_artifact(b) as y:
        for n in x.tensor_names():
            assert x.tensor_info(n)["sha256"] == y.tensor_info(n)["sha256"], n
        assert x.descriptor["source"]["expert_layout"] == ["per-expert"]
        assert y.descriptor["source"]["expert_layout"] == ["fused", "per-expert"]  # MTP experts stay per-expert


def test_without_mtp_and_template_inside_tokenizer_config(tiny_checkpoint_dir, tmp_path):
    src = _copy(tiny_checkpoint_dir("dense", "text"), tmp_path / "src")
    sd = {k: v for k, v in load_file(src / "model.safetensors").items() if not k.startswith("mtp.")}
    save_file(sd, str(src / "model.safetensors"))
    tpl = (src / "chat_template.jinja").read_text()
    (src / "chat_template.jinja").unlink()
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = tpl
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    out = convert(src, tmp_path / "m.ninfer", dtype="bf16")
    with open_artifact(out) as art:
        assert not art.has_group("mtp") and not art.has_group("vision")
        assert art.frontend_resources()["chat_template.jinja"].decode() == tpl


def test_deterministic_output(tiny_checkpoint_dir, tmp_path):
    src = tiny_checkpoint_dir("dense", "official")
    a = convert(src, tmp_path / "a.ninfer", dtype="bf16")
    b = convert(src, tmp_path / "b.ninfer", dtype="bf16")
    assert a.read_bytes() == b.read_bytes()


# ---------------------------------------------------------------- failures

def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        shutil.copyfile(p, dst / p.name)
    return dst


def _edit_tensors(src: Path, fn) -> None:
    path = src / "model.safetensors"
    sd = load_file(path)
    fn(sd)
    save_file(sd, str(path))


def _rejects(src: Path, tmp_path: Path, *patterns: str, **kw) -> str:
    out = tmp_path / "out" / "m.ninfer"
    out.parent.mkdir(exist_ok=True)
    with pytest.raises(ConvertError) as ei:
        convert(src, out, **kw)
    msg = str(ei.value)
    for p in patterns:
        assert re.search(p, msg), (p, msg)
    _no_leftovers(out.parent, out)
    return msg


@pytest.fixture
def moe_src(tiny_checkpoint_dir, tmp_path):
    return _copy(tiny_checkpoint_dir("moe", "official"), tmp_path / "src")


def test_config_matching_no_identity(moe_src, tmp_path):
    cfg = json.loads((moe_src / "config.json").read_text())
    cfg["text_config"]["linear_num_value_heads"] = 8
    cfg["text_config"]["num_experts"] = 16
    (moe_src / "config.json").write_text(json.dumps(cfg))
    _rejects(moe_src, tmp_path, r"matches no known identity", r"closest is qwen3_6-tiny-moe",
             r"linear_num_value_heads=8 \(expected 4\)", r"num_experts=16 \(expected 8\)", r"2 differing")


def test_wrong_target(moe_src, tmp_path):
    _rejects(moe_src, tmp_path, r"does not match qwen3_6-tiny-dense", r"num_experts=8 \(expected 0\)",
             target="qwen3_6-tiny-dense")
    _rejects(moe_src, tmp_path, r"unknown --target 'nope'", target="nope")


def test_not_a_qwen36_config(moe_src, tmp_path):
    cfg = json.loads((moe_src / "config.json").read_text())
    cfg["model_type"] = "llama"
    (moe_src / "config.json").write_text(json.dumps(cfg))
    _rejects(moe_src, tmp_path, r"model_type 'llama'")


def test_missing_tensor(moe_src, tmp_path):
    def drop(sd):
        del sd["model.language_model.layers.0.linear_attn.A_log"]
        del sd["mtp.layers.0.mlp.experts.3.down_proj.weight"]
    _edit_tensors(moe_src, drop)
    _rejects(moe_src, tmp_path, r"missing tensor\(s\): layers\.0\.linear_attn\.A_log",
             r"missing mtp\.layers\.0\.mlp\.experts\.3\.down_proj\.weight")


def test_wrong_shape(moe_src, tmp_path):
    def reshape(sd):
        sd["model.language_model.layers.3.self_attn.k_proj.weight"] = torch.zeros(64, 64)
        sd["model.language_model.layers.1.mlp.experts.down_proj"] = torch.zeros(8, 64, 16)
    _edit_tensors(moe_src, reshape)
    _rejects(moe_src, tmp_path, r"wrong shape", r"layers\.3\.self_attn\.k_proj\.weight \[64, 64\] \(expected \[128, 64\]\)",
             r"layers\.1\.mlp\.experts\.down_proj \[8, 64, 16\] \(expected \[8, 64, 32\]\)")


def test_unexpected_tensor(moe_src, tmp_path):
    def add(sd):
        sd["model.language_model.layers.0.linear_attn.extra.weight"] = torch.zeros(2)
        sd["bogus.weight"] = torch.zeros(2)
    _edit_tensors(moe_src, add)
    _rejects(moe_src, tmp_path, r"unexpected tensor\(s\): layers\.0\.linear_attn\.extra\.weight",
             r"unknown names: bogus\.weight")


def test_partial_vision_group(moe_src, tmp_path):
    _edit_tensors(moe_src, lambda sd: sd.pop("model.visual.merger.norm.bias"))
    _rejects(moe_src, tmp_path, r"missing tensor\(s\): visual\.merger\.norm\.bias")


def test_truncated_shard(moe_src, tmp_path):
    p = moe_src / "model.safetensors"
    os.truncate(p, p.stat().st_size - 1000)
    _rejects(moe_src, tmp_path, r"shard model\.safetensors is truncated")


def test_truncated_shard_of_index(tiny_checkpoint_dir, tmp_path):
    src = _sharded(tiny_checkpoint_dir("dense", "official"), tmp_path / "src", 3)
    p = src / "model-00002-of-00003.safetensors"
    os.truncate(p, 100)
    _rejects(src, tmp_path, r"shard model-00002-of-00003\.safetensors is truncated")
    p.unlink()
    _rejects(src, tmp_path, r"missing: model-00002-of-00003\.safetensors")


def test_missing_frontend_files(moe_src, tmp_path):
    (moe_src / "chat_template.jinja").unlink()
    _rejects(moe_src, tmp_path, r"no chat template")
    (moe_src / "tokenizer.json").unlink()
    _rejects(moe_src, tmp_path, r"tokenizer\.json not found")
    (moe_src / "config.json").unlink()
    _rejects(moe_src, tmp_path, r"config\.json not found")


def test_full_disk_leaves_nothing(tiny_checkpoint_dir, tmp_path, monkeypatch):
    import errno

    import ninfer.artifact.writer as writer

    real_write, budget = os.write, [20 << 20]

    def write(fd, data):
        if fd > 2:
            budget[0] -= len(data)
            if budget[0] < 0:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(writer.os, "write", write)
    out = tmp_path / "m.ninfer"
    out.write_bytes(b"previous")
    with pytest.raises(Exception) as ei:
        convert(tiny_checkpoint_dir("dense", "official"), out)
    assert "no space left on device" in str(ei.value)
    assert out.read_bytes() == b"previous"  # the old file is untouched; no temp file remains
    assert [p.name for p in tmp_path.iterdir()] == ["m.ninfer"]


@pytest.mark.parametrize("fname,identity", [("Qwen3.6-27B", "qwen3_6-27b"), ("Qwen3.6-35B-A3B", "qwen3_6-35b-a3b")])
def test_official_configs_match_their_registered_identity(fname, identity):
    from ninfer.convert.identify import config_facts, match_identity
    from ninfer.targets.registry import REGISTRY

    path = Path("/work/shared/data/configs") / f"{fname}.config.json"
    if not path.exists():
        pytest.skip("official configs not available")
    facts = config_facts(json.loads(path.read_text()))
    assert facts["mtp_num_hidden_layers"] == 1 and "vision.depth" in facts
    assert match_identity(facts, REGISTRY).identity == identity


def test_the_closest_identity_is_one_of_the_same_ffn_kind():
    """A small dense Qwen3.5-architecture config is compared with the dense identities (it was told
    the MoE one was closest: fewer of its fields differed)."""
    from ninfer.convert.identify import config_facts, match_identity
    from ninfer.targets.registry import REGISTRY

    small_dense = {"model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 24,
                   "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
                   "linear_num_value_heads": 16, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                   "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
                   "intermediate_size": 6144, "tie_word_embeddings": True}
    with pytest.raises(ConvertError) as ei:
        match_identity(config_facts(small_dense), REGISTRY)
    msg = str(ei.value)
    assert "dense FFN 6144, 24 layers, hidden 2048" in msg and "closest is qwen3_6-27b" in msg
    assert "num_experts" not in msg and "ninfer identities" in msg
