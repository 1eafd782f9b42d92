"""`ninfer score [MODEL] --input FILE`: log-likelihood and perplexity of documents (CausalScoring engine).

Input: plain text (the whole file is one document) or JSONL (`.jsonl`, or a file whose first
non-blank character is `{`), one object per line with either `text` (every token scored but the
first) or `context` + `continuation` (only the continuation's tokens are scored, given the context:
evaluation harnesses' log-likelihood; trailing whitespace of the context moves to the
continuation, as lm-evaluation-harness does). `-` reads stdin.

Output (`--output FILE`, default stdout): one JSON object per document with num_tokens,
num_scored_tokens, logprob, perplexity, is_greedy and, with --per-token, the tokens' ids, texts
and log-probs (null where unscored) and --top-k alternatives (--top-k needs --per-token). A
progress bar (tokens) and a summary line (documents, tokens, corpus perplexity, tokens/s) go to
stderr; "tokens" counts as num_tokens does (with --add-bos, the BOS too).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace

from ninfer.gateway.cli.common import add_engine_args, add_model_arg, engine_config, open_engine, resolve_model
from ninfer.gateway.cli.main import CLIError
from ninfer.config import Purpose, ScoreInput

_SKIP = ("max_concurrency", "queue_size", "request_timeout_s", "prefill_chunk_tokens", "num_pages",
         "kv_memory_fraction", "enforce_eager", "seed", "prefix_cache", "cache_slots", "cache_device_bytes",
         "cache_host_bytes", "cache_capture_stride", "decode_step_ahead",
         "speculative")                                                                   # generation-only settings


def add_parser(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)
    p.add_argument("-i", "--input", required=True, help="plain text or JSONL file ('-' reads stdin)")
    p.add_argument("-o", "--output", default=None, help="JSONL results (default: stdout)")
    p.add_argument("--window", type=int, default=None,
                   help="tokens per scoring window (default: --max-model-len; raises it when larger)")
    p.add_argument("--stride", type=int, default=None,
                   help="tokens the window moves (default: --window, no overlap); overlap tokens are context")
    p.add_argument("--per-token", action="store_true", help="write every token's log-prob")
    p.add_argument("--top-k", type=int, default=0, help="alternatives per token (0..20; needs --per-token)")
    p.add_argument("--add-bos", action="store_true",
                   help="prepend <|endoftext|> so the first token is scored too (the family has no BOS)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_args(p, skip=_SKIP)


def read_documents(path: str) -> list[ScoreInput]:
    try:
        raw = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as e:
        raise CLIError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise CLIError(f"{path} is not UTF-8 text: {e}") from None
    if not (path.endswith(".jsonl") or raw.lstrip().startswith("{")):
        if not raw:
            raise CLIError(f"{path} is empty")
        return [ScoreInput(text=raw)]
    docs = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CLIError(f"{path}:{n}: not a JSON object: {e.msg}") from None
        if not isinstance(obj, dict):
            raise CLIError(f"{path}:{n}: expected a JSON object")
        if isinstance(obj.get("text"), str):
            docs.append(ScoreInput(text=obj["text"]))
        elif isinstance(obj.get("context"), str) and isinstance(obj.get("continuation"), str):
            ctx, cont = obj["context"], obj["continuation"]
            spaces = len(ctx) - len(ctx.rstrip())
            if spaces:                               # NOTE: as lm-evaluation-harness splits the pair
                ctx, cont = ctx[:-spaces], ctx[-spaces:] + cont
            docs.append(ScoreInput(text=cont, context=ctx))
        else:
            raise CLIError(f"{path}:{n}: needs a string field 'text', or 'context' and 'continuation'")
    if not docs:
        raise CLIError(f"{path} holds no documents")
    return docs


def _record(index: int, res, pieces, per_token: bool) -> dict:
    out = {"index": index, "num_tokens": res.num_tokens, "num_context_tokens": res.num_context_tokens,
           "num_scored_tokens": res.num_scored_tokens, "logprob": res.logprob,
           "perplexity": res.perplexity, "is_greedy": res.is_greedy}
    if per_token:
        out["token_ids"] = list(res.token_ids)
        out["tokens"] = [pieces(t) for t in res.token_ids]
        out["token_logprobs"] = [None if e is None else e.logprob for e in res.token_logprobs]
        if any(e is not None and e.top for e in res.token_logprobs):
            out["top_logprobs"] = [None if e is None else {pieces(t): lp for t, lp in e.top}
                                   for e in res.token_logprobs]
    return out


def _check_writable(path: str) -> None:
    """Refuse an unwritable --output before the model loads (the file itself is opened later)."""
    target = os.path.abspath(path)
    parent = os.path.dirname(target)
    if os.path.isdir(target):
        raise CLIError(f"cannot write {path}: it is a directory")
    if not os.path.isdir(parent):
        raise CLIError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(target if os.path.exists(target) else parent, os.W_OK):
        raise CLIError(f"cannot write {path}: permission denied")


def run(args: argparse.Namespace) -> int:
    if args.window is not None and args.window < 2:
        raise CLIError(f"--window must be >= 2, got {args.window}")
    if args.stride is not None and args.stride < 1:
        raise CLIError(f"--stride must be >= 1, got {args.stride}")
    if not (0 <= args.top_k <= 20):
        raise CLIError(f"--top-k must be in 0..20, got {args.top_k}")
    if args.top_k and not args.per_token:
        raise CLIError("--top-k needs --per-token (the alternatives are listed per token)")
    docs = read_documents(args.input)
    if args.output is not None:
        _check_writable(args.output)
    config = engine_config(args, Purpose.CAUSAL_SCORING)
    if args.window is not None and args.window > config.max_model_len:
        try:
            config = replace(config, max_model_len=args.window)
        except ValueError as e:
            raise CLIError(f"--window: {e}") from None
    window = args.window or config.max_model_len        # NOTE: 0 (auto): the Engine's, known once it starts
    if window and args.stride is not None and args.stride > window:
        raise CLIError(f"--stride ({args.stride}) must not exceed the window ({window})")
    path, _, _ = resolve_model(args.model, config=config)
    engine = open_engine(path, config)
    if not window:
        window = engine.max_model_len
        if args.stride is not None and args.stride > window:
            engine.close()
            raise CLIError(f"--stride ({args.stride}) must not exceed the window ({window})")
    out = sys.stdout if args.output is None else None
    try:
        tok = engine.frontend.tokenizer
        pieces = lambda t: tok.decode([t], skip_special_tokens=False)  # noqa: E731
        inputs = [ScoreInput(token_ids=tuple(tok.encode(d.text)),
                             context_ids=tuple(tok.encode(d.context)) if d.context else None) for d in docs]
        # NOTE: one count of a document's tokens everywhere: ScoreResult.num_tokens (BOS included)
        total_tokens = sum(len(x.token_ids) + len(x.context_ids or ()) + int(args.add_bos) for x in inputs)
        bar = None
        if not args.no_progress:
            from tqdm import tqdm
            bar = tqdm(total=total_tokens, unit="tok", desc="scoring", file=sys.stderr, dynamic_ncols=True)
        if out is None:
            try:
                out = open(args.output, "w", encoding="utf-8")
            except OSError as e:
                raise CLIError(f"cannot write {args.output}: {e.strerror or e}") from None
        t0 = time.monotonic()
        logprob, scored, num_tokens = 0.0, 0, 0
        try:
            for i, x in enumerate(inputs):
                [res] = engine.score(x, window=window, stride=args.stride, per_token=args.per_token,
                                     top_k=args.top_k, add_bos=args.add_bos,
                                     progress=bar.update if bar is not None else None)
                logprob += res.logprob
                scored += res.num_scored_tokens
                num_tokens += res.num_tokens
                out.write(json.dumps(_record(i, res, pieces, args.per_token), ensure_ascii=False) + "\n")
                out.flush()
        finally:
            if bar is not None:
                bar.close()
        elapsed = time.monotonic() - t0
        ppl = f"{math.exp(-logprob / scored):.4f}" if scored else "n/a"
        rate = num_tokens / elapsed if elapsed > 0 else 0.0
        print(f"[score] documents={len(inputs)} tokens={num_tokens} scored_tokens={scored} "
              f"logprob={logprob:.4f} perplexity={ppl} window={window} stride={args.stride or window} "
              f"tokens/s={rate:.1f}", file=sys.stderr)
        return 0
    finally:
        if out is not None and out is not sys.stdout:
            out.close()
        engine.close()
