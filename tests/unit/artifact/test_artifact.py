"""`.ninfer` format: write_artifact from in-process tensors, zero-copy reads, and every kind of bad
file rejected with one ArtifactError that names the problem, leaving nothing open."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
from pathlib import Path

import pytest
import torch

from ninfer.artifact import ArtifactError, ChunkedTensor, open_artifact, write_artifact
from ninfer.artifact.format import HEADER_STRUCT, pack_header
from ninfer.targets.qwen3_6.schema import tensor_specs
from ninfer.targets.registry import lookup

TINY = "qwen3_6-tiny-dense"
RES = {"tokenizer.json": b'{"model": {}}', "tokenizer_config.json": b"{}", "chat_template.jinja": b"{{ x }}",
       "generation_config.json": b'{"eos_token_id": [248046, 248044], "temperature": 0.7}'}


def _random_weights(identity: str = TINY, groups=("embedding", "gdn", "attention", "ffn", "head"), seed=0):
    g = torch.Generator().manual_seed(seed)
    for s in tensor_specs(lookup(identity).dims, groups):
        yield s.name, torch.randn(s.shape, generator=g)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def small(tmp_path) -> Path:
    return write_artifact(tmp_path / "s.ninfer", TINY, _random_weights(), RES, dtype="bf16")


def test_write_from_iterator_and_read_back(tmp_path):
    want = dict(_random_weights())
    path = write_artifact(tmp_path / "m.ninfer", TINY, iter(want.items()), RES, dtype="bf16")
    with open_artifact(path, verify=True) as art:
        assert art.identity == TINY and art.package is lookup(TINY) and art.dims == lookup(TINY).dims
        assert art.groups == ("embedding", "gdn", "attention", "ffn", "head")
        assert not art.has_group("vision") and not art.has_group("mtp")
        assert art.tensor_names() == list(want)
        for n, t in want.items():
            got = art.tensor(n)
            exp = t if n.endswith(("linear_attn.A_log", "linear_attn.norm.weight")) else t.to(torch.bfloat16)
            assert got.dtype == exp.dtype and torch.equal(got, exp), n
        assert art.frontend_resources() == RES
        assert art.eos_token_ids == (248046, 248044)
        assert art.generation_config["temperature"] == 0.7
        for e in art.descriptor["tensors"]:
            assert e["offset"] % 4096 == 0


def test_chunked_tensor_and_all_groups(tmp_path):
    def weights():
        for name, t in _random_weights(groups=("embedding", "gdn", "attention", "ffn", "head", "mtp", "vision")):
            if name == "embed_tokens.weight":  # produced in pieces, as the converter does for huge tensors
                flat = t.reshape(-1)
                yield name, ChunkedTensor(t.shape, t.dtype, lambda f=flat: iter(f.split(1000)))
            else:
                yield name, t
    ref = dict(_random_weights(groups=("embedding", "gdn", "attention", "ffn", "head", "mtp", "vision")))
    path = write_artifact(tmp_path / "m.ninfer", TINY, weights(), RES, dtype="fp32")
    with open_artifact(path, verify=True) as art:
        assert art.has_group("mtp") and art.has_group("vision")
        assert torch.equal(art.tensor("embed_tokens.weight"), ref["embed_tokens.weight"])


def test_tensors_are_zero_copy_views_and_outlive_close(small):
    art = open_artifact(small)
    a, b = art.tensor("embed_tokens.weight"), art.tensor("lm_head.weight")
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert a.data_ptr() - a.untyped_storage().data_ptr() == art.tensor_info("embed_tokens.weight")["offset"]
    before = a.clone()
    art.close()
    assert torch.equal(a, before)
    with pytest.raises(ArtifactError, match="closed"):
        art.tensor("embed_tokens.weight")


@pytest.mark.parametrize("case,pattern", [
    ("missing", r"missing tensor\(s\): lm_head\.weight"),
    ("shape", r"layers\.0\.linear_attn\.A_log has shape \[5\], expected \[6\]"),
    ("unexpected", r"unexpected tensor foo\.weight"),
    ("partial_group", r"missing tensor\(s\): .*visual\."),
    ("resource", r"missing frontend resource\(s\): chat_template\.jinja"),
    ("identity", r"unknown model identity 'qwen3_6-huge'"),
    ("eos", r"invalid or missing eos token ids"),
])
def test_writer_rejects_and_leaves_nothing(tmp_path, case, pattern):
    weights = dict(_random_weights())
    res, identity = dict(RES), TINY
    if case == "missing":
        del weights["lm_head.weight"]
    elif case == "shape":
        weights["layers.0.linear_attn.A_log"] = torch.zeros(5)
    elif case == "unexpected":
        weights["foo.weight"] = torch.zeros(1)
    elif case == "partial_group":
        weights["visual.merger.norm.bias"] = torch.zeros(32)
    elif case == "resource":
        del res["chat_template.jinja"]
    elif case == "identity":
        identity = "qwen3_6-huge"
    elif case == "eos":
        res["generation_config.json"] = b"{}"
    with pytest.raises(ArtifactError, match=pattern):
        write_artifact(tmp_path / "m.ninfer", identity, weights.items(), res)
    assert list(tmp_path.iterdir()) == []


def test_writer_failure_in_the_producer_removes_the_temp_file(tmp_path):
    def weights():
        yield from list(_random_weights())[:5]
        raise RuntimeError("producer died")
    with pytest.raises(RuntimeError):
        write_artifact(tmp_path / "m.ninfer", TINY, weights(), RES)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- bad files

def _rewrite_descriptor(path: Path, edit) -> None:
    """Re-frame the file with an edited descriptor (valid header checksum), as a buggy writer would."""
    data = bytearray(path.read_bytes())
    _, _, _, off, n, _, _ = HEADER_STRUCT.unpack_from(data)
    desc = json.loads(data[off:off + n])
    edit(desc)
    blob = json.dumps(desc).encode()
    data = data[:off] + blob
    data[:HEADER_STRUCT.size] = pack_header(off, len(blob), len(data), hashlib.sha256(blob).digest())
    path.write_bytes(bytes(data))


def _first(desc, name):
    return next(e for e in desc["tensors"] if e["name"] == name)


def _overlap(d):
    _first(d, "lm_head.weight")["offset"] = _first(d, "embed_tokens.weight")["offset"]


def _past_end(d):
    _first(d, "norm.weight")["offset"] = 1 << 40


def _nbytes(d):
    _first(d, "norm.weight")["nbytes"] += 4


def _drop(d):
    d["tensors"] = [e for e in d["tensors"] if e["name"] != "norm.weight"]


def _identity(d):
    d["identity"] = "qwen3_6-1t"


def _dims(d):
    d["dims"]["hidden_size"] = 65


def _misaligned(d):
    _first(d, "norm.weight")["offset"] += 2


@pytest.mark.parametrize("edit,pattern", [
    (_overlap, r"overlaps tensor embed_tokens\.weight"),
    (_past_end, r"norm\.weight at offset \d+\+\d+ runs past the payload region"),
    (_nbytes, r"tensor norm\.weight: shape \[64\] x bf16 != nbytes 132"),
    (_drop, r"missing tensor\(s\): norm\.weight"),
    (_identity, r"unknown model identity 'qwen3_6-1t'"),
    (_dims, r"dimension facts disagree .*: hidden_size"),
    (_misaligned, r"not aligned"),
])
def test_inconsistent_descriptor(small, edit, pattern):
    _rewrite_descriptor(small, edit)
    fds = _open_fds()
    with pytest.raises(ArtifactError, match=pattern):
        open_artifact(small)
    assert _open_fds() == fds


def _flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x40
    path.write_bytes(bytes(data))


def test_bad_framing(small, tmp_path):
    fds = _open_fds()
    good = small.read_bytes()
    cases = {
        "magic": (b"GGUF" + good[4:], r"not a \.ninfer file \(wrong magic\)"),
        "empty": (b"", r"wrong magic"),
        "version": (good[:8] + struct.pack("<I", 7) + good[12:], r"unsupported \.ninfer format version 7"),
        "truncated": (good[: len(good) // 2], r"is truncated: \d+ bytes, the header says \d+"),
        "trailing": (good + b"\0" * 10, r"10 unexpected trailing bytes"),
    }
    for name, (data, pattern) in cases.items():
        p = tmp_path / f"{name}.ninfer"
        p.write_bytes(data)
        with pytest.raises(ArtifactError, match=pattern):
            open_artifact(p)
    with pytest.raises(ArtifactError, match="cannot open"):
        open_artifact(tmp_path / "absent.ninfer")
    assert _open_fds() == fds


def test_corrupted_bytes(small):
    with open_artifact(small) as art:
        emb = art.tensor_info("layers.3.self_attn.q_proj.weight")
        res = art.descriptor["resources"][0]
        d_off = HEADER_STRUCT.unpack_from(small.read_bytes())[3]
    fds = _open_fds()
    _flip(small, emb["offset"] + 77)
    open_artifact(small).close()  # payload checksums are checked only when asked
    with pytest.raises(ArtifactError, match=r"checksum mismatch in tensor layers\.3\.self_attn\.q_proj\.weight"):
        open_artifact(small, verify=True)
    _flip(small, emb["offset"] + 77)
    _flip(small, res["offset"] + 3)
    with open_artifact(small) as art, pytest.raises(ArtifactError, match=r"resource tokenizer\.json is corrupted"):
        art.frontend_resources()
    with pytest.raises(ArtifactError, match=r"resource tokenizer\.json is corrupted"):
        open_artifact(small, verify=True)
    _flip(small, res["offset"] + 3)
    _flip(small, d_off + 5)
    with pytest.raises(ArtifactError, match="descriptor checksum mismatch"):
        open_artifact(small)
    assert _open_fds() == fds


def test_unregistered_package_is_refused_on_open(tmp_path):
    pkg = dataclasses.replace(lookup(TINY), identity="qwen3_6-bench")
    path = write_artifact(tmp_path / "b.ninfer", pkg, _random_weights(), RES)
    with pytest.raises(ArtifactError, match="unknown model identity 'qwen3_6-bench'"):
        open_artifact(path)
