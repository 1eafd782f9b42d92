"""TTFT of an image + question over HTTP against what it is made of (a developer tool; issue 49's benchmark).

    python3 bench/vision_ttft.py [--identity qwen3_6-27b qwen3_6-35b-a3b] [--image 1024x1024]
        [--question-tokens 100] [--reps 5] [--device cuda|cpu] [--out DIR]

Per identity: `ninfer serve --load-format dummy --no-prefix-cache` (synthetic weights, the vision tower included), then, each
--reps times after one untimed warm-up, streamed chat requests (1 output token, greedy) timed to the chunk of the first
output token (not the assistant-role chunk sent before the prefill):
  image     an image of --image pixels (synthetic; --format jpeg or png) and a question of about
            --question-tokens tokens
  text      a text-only prompt of the same token count as the image request's (the `/tokenize` count)
The difference between the image request and the text request of equal length is what the image adds (the vision
rows replace the placeholders' embeddings; every other step is the same). Reported: TTFT image, TTFT text, their difference, and with the
tower's encode time measured apart (--encode-ms, from `bench/vision_encode.py`) image / (text + encode).
Prints a table and one JSON line (`bench`: vision_ttft); --out DIR also writes DIR/vision_ttft.json.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from ninfer.bench.common import Recorder, env_record, print_table  # noqa: E402
from ninfer.bench.serve import Server  # noqa: E402


def _image_url(w: int, h: int, fmt: str) -> str:
    """A data: URL of a synthetic w x h image. jpeg: smooth colour gradients with mild noise at quality 90
    (what a photo costs to send and decode); png: uniform noise (the costliest to decode, incompressible)."""
    from PIL import Image
    rng = np.random.default_rng(0)
    if fmt == "png":
        a = (rng.random((h, w, 3)) * 255).astype(np.uint8)
    else:
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        base = np.stack([x / w, y / h, 0.5 + 0.5 * np.sin((x + y) / 50.0)], axis=-1) * 220
        a = np.clip(base + rng.normal(0, 8, (h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG" if fmt == "png" else "JPEG", quality=90)
    return f"data:image/{fmt};base64," + base64.b64encode(buf.getvalue()).decode()


def _question(n: int) -> str:
    return " ".join(["what"] * max(1, n - 8)) + "?"


def _ttft(client: httpx.Client, model: str, content) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0.0,
            "stream": True, "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}
    t0 = time.perf_counter()
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:300]}")
        for line in r.iter_lines():
            if _carries_token(line):
                return (time.perf_counter() - t0) * 1e3
    raise RuntimeError("the stream carried no token")


def _carries_token(line: str) -> bool:
    """Whether an SSE line is a chunk made by the first output token: text in its delta, or its finish reason
    (a token that decodes to no text yet). The first chunk, the assistant role, is sent before any prefill and
    does not count."""
    if not line.startswith("data:") or line.strip() == "data: [DONE]":
        return False
    chunk = json.loads(line[5:])
    for c in chunk.get("choices") or ():
        d = c.get("delta") or {}
        if d.get("content") or d.get("reasoning_content") or d.get("tool_calls") or c.get("finish_reason"):
            return True
    return False


def run_identity(identity: str, args, rec: Recorder, log_dir: Path) -> None:
    w, h = (int(x) for x in args.image.lower().split("x"))
    server = Server(identity, max_concurrency=1, max_model_len=args.max_model_len, device=args.device,
                    log_path=log_dir / f"serve-{identity}.log",
                    # every rep repeats the same two prompts: with the context cache on, the later ones would hit it
                    extra=["--no-prefix-cache", *(["--no-warmup"] if args.no_warmup else [])])
    try:
        server.wait_ready(args.ready_timeout)
        with httpx.Client(base_url=server.url, timeout=600) as client:
            image = [{"type": "image_url", "image_url": {"url": _image_url(w, h, args.format)}},
                     {"type": "text", "text": _question(args.question_tokens)}]
            msgs = [{"role": "user", "content": image}]
            n = client.post("/tokenize", json={"model": server.name, "messages": msgs}).json()["count"]
            # a text prompt of the same token count: the question's words stand in for the placeholders
            base = client.post("/tokenize", json={"model": server.name, "messages": [
                {"role": "user", "content": _question(args.question_tokens)}]}).json()["count"]
            text = _question(args.question_tokens + (n - base))
            times = {"image": [], "text": []}
            for i in range(args.reps + 1):
                for kind, content in (("image", image), ("text", text)):
                    ms = _ttft(client, server.name, content)
                    if i:
                        times[kind].append(ms)
    finally:
        server.stop()
    ti, tt = statistics.median(times["image"]), statistics.median(times["text"])
    # NOTE: the ratio needs the encode measured apart (--encode-ms); the difference alone would make it 1.
    enc = args.encode_ms or None
    row = dict(identity=identity, image=args.image, format=args.format, prompt_tokens=n, ttft_image_ms=ti, ttft_text_ms=tt,
               image_minus_text_ms=ti - tt, encode_ms=enc, ratio=ti / (tt + enc) if enc else None)
    rec.add(row)
    ratio = "-" if enc is None else f"{row['ratio']:.3f}"
    print(f"[{identity}] {n} prompt tokens: TTFT image {ti:.1f} ms, text {tt:.1f} ms (difference {ti - tt:.1f} ms), "
          f"image / (text + encode) {ratio}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--identity", nargs="+", default=["qwen3_6-27b", "qwen3_6-35b-a3b"])
    ap.add_argument("--image", default="1024x1024")
    ap.add_argument("--format", choices=["jpeg", "png"], default="jpeg",
                    help="jpeg: a photo-like image at quality 90; png: uniform noise (the slowest to decode)")
    ap.add_argument("--question-tokens", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--encode-ms", type=float, default=0.0, help="the tower's encode time of the image, measured apart")
    ap.add_argument("--device", default=None)
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--ready-timeout", type=float, default=900.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    env = env_record()
    print(f"env: {env}", flush=True)
    rec = Recorder("vision_ttft", args.out, {"env": env, "image": args.image, "question_tokens": args.question_tokens,
                                             "weights": "dummy (synthetic)"})
    log_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="vision-ttft-"))
    for ident in args.identity:
        try:
            run_identity(ident, args, rec, log_dir)
        except Exception as e:                      # one identity's failure does not hide the others' rows
            rec.error(f"{ident}: {e}")
    print()
    print_table(["identity", "tokens", "ttft_image_ms", "ttft_text_ms", "image-text ms", "encode_ms",
                 "image/(text+encode)"],
                [[r["identity"], r["prompt_tokens"], r["ttft_image_ms"], r["ttft_text_ms"], r["image_minus_text_ms"],
                  r["encode_ms"], r["ratio"]] for r in rec.results])
    rec.finish()
    return 1 if rec.errors and not rec.results else 0


if __name__ == "__main__":
    sys.exit(main())
