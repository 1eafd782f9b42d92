"""Qwen3.6 tokenizer over the artifact's tokenizer.json (the `tokenizers` library).

Encoding adds no BOS/EOS. Decoding is byte-level; `token_piece` exposes one token's raw bytes
(ordinary tokens) or text (added tokens) for incremental, UTF-8-safe detokenization.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

from tokenizers import Tokenizer

from .vocab import bytes_to_unicode


class Qwen36Tokenizer:
    def __init__(self, tokenizer_json: bytes | str, tokenizer_config: dict | None = None):
        text = tokenizer_json.decode("utf-8") if isinstance(tokenizer_json, bytes) else tokenizer_json
        # NOTE: the vocabulary's identity (views built from it, e.g. the grammar library's, are shared by it)
        self.digest = hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()
        self._tok = Tokenizer.from_str(text)
        self._tok.no_padding()
        self._tok.no_truncation()
        added = {int(i): (t.content, bool(t.special))
                 for i, t in self._tok.get_added_tokens_decoder().items()}
        for tid, meta in (tokenizer_config or {}).get("added_tokens_decoder", {}).items():
            if int(tid) in added:          # tokenizer_config's flags win, as in transformers
                added[int(tid)] = (meta.get("content", added[int(tid)][0]),
                                   bool(meta.get("special", True)))
        self.added_tokens: dict[int, str] = {i: c for i, (c, _) in added.items()}
        self.special_ids: frozenset[int] = frozenset(i for i, (_, sp) in added.items() if sp)
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self._byte_decoder = {c: b for b, c in bytes_to_unicode().items()}
        self._bytes: dict[int, bytes] = {}

    # ------------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = list(ids)
        if skip_special_tokens:
            # NOTE: filter here so tokenizer_config's "special" flags (not only tokenizer.json's)
            # decide, exactly as transformers does.
            ids = [i for i in ids if i not in self.special_ids]
        return self._tok.decode(ids, skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_piece(self, token_id: int) -> bytes | str:
        """Raw bytes of an ordinary token, or the text of an added token."""
        if token_id in self.added_tokens:
            return self.added_tokens[token_id]
        b = self._bytes.get(token_id)
        if b is None:
            tok = self._tok.id_to_token(token_id)
            if tok is None:
                raise ValueError(f"token id {token_id} is not in the vocabulary")
            b = bytes(self._byte_decoder[c] for c in tok)
            self._bytes[token_id] = b
        return b

    @property
    def backend(self) -> Tokenizer:
        return self._tok
