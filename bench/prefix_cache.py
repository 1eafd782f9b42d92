"""Context-cache benchmark: replay multi-turn agent-style conversations through the public Engine
with the prefix cache on and off; report hit rate, reused tokens, TTFT and check that greedy
outputs are identical.

    python bench/prefix_cache.py                         # the demo model (random weights), CPU
    python bench/prefix_cache.py MODEL.ninfer --device cuda --sessions 8 --turns 6

Each session is a system prompt + tool definitions shared by all sessions, then turns of
(user message or tool result) -> assistant reply, the reply fed back as history, as an agent
loop resends its growing conversation. Sessions run concurrently (one turn in flight each).
Prints a table and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from ninfer.bench.common import env_record, json_line, print_table

from ninfer import Engine
from ninfer.contract.program import SamplingParams
from ninfer.contract.frontend import OutputOptions
from ninfer.config import EngineConfig, GenerationDelta, GenerationResult, GenerationStart

SYSTEM = ("You are a coding agent. You can read files, run shell commands and edit code. Think step by "
          "step, call tools when you need information, and answer concisely. " * 3)
TOOLS = [{"type": "function", "function": {"name": name, "description": desc, "parameters": {
    "type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}}}
    for name, desc in (("read_file", "Read a file"), ("run", "Run a shell command"), ("edit", "Edit a file"))]
USER_TURNS = ["The tests in tests/test_io.py fail with a KeyError. Find out why.",
              "Here is the output of the command: KeyError: 'path' at io.py line 42.",
              "The file io.py reads config['path'] without a default. Fix it.",
              "Run the tests again and summarise.",
              "Now also add a test for the missing key.",
              "Great. Write a one-line commit message."]


def replay(engine: Engine, sessions: int, turns: int, max_tokens: int, use_session: bool) -> dict:
    fe = engine.frontend
    greedy = SamplingParams(temperature=0.0)
    histories = [[{"role": "system", "content": SYSTEM}] for _ in range(sessions)]
    outputs: list[list[tuple[int, ...]]] = [[] for _ in range(sessions)]
    ttft, prompt_tokens, reused = [], 0, 0
    t0 = time.perf_counter()
    for t in range(turns):
        handles = []
        for s in range(sessions):
            histories[s].append({"role": "user", "content": f"[session {s}] {USER_TURNS[t % len(USER_TURNS)]}"})
            prompt = fe.prepare_chat(histories[s], tools=TOOLS, chat_template_kwargs={"enable_thinking": False})
            sent = time.perf_counter()
            h = engine.submit(prompt, greedy, max_tokens=max_tokens, output=OutputOptions(ignore_eos=True),
                              session_id=f"agent-{s}" if use_session else None)
            handles.append((s, h, sent))
        for s, h, sent in handles:
            first = None
            for ev in h:
                if isinstance(ev, GenerationDelta) and first is None:
                    first = time.perf_counter()
                elif isinstance(ev, GenerationStart):
                    pass
                elif isinstance(ev, GenerationResult):
                    ttft.append((first or time.perf_counter()) - sent)
                    prompt_tokens += ev.usage.num_prompt_tokens
                    reused += ev.usage.cached_tokens
                    outputs[s].append(ev.token_ids)
                    histories[s].append({"role": "assistant", "content": ev.text})
    wall = time.perf_counter() - t0
    m = engine.metrics()
    return dict(outputs=outputs, wall_s=wall, ttft_mean_s=statistics.mean(ttft), ttft_p50_s=statistics.median(ttft),
                prompt_tokens=prompt_tokens, reused_tokens=reused,
                hit_rate=(m.num_cache_hits / m.num_cache_queries) if m.num_cache_queries else 0.0,
                token_hit_rate=reused / prompt_tokens if prompt_tokens else 0.0,
                captures=m.num_cache_captures, evictions=m.num_cache_evictions)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None, help=".ninfer artifact (default: the demo model)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--no-session", action="store_true", help="send no session_id (prefix index only)")
    args = ap.parse_args(argv)
    if args.model is None:
        from ninfer.demo import ensure_demo_artifact
        args.model = str(ensure_demo_artifact())
    results = {}
    for cache in (False, True):
        cfg = EngineConfig(device=args.device, max_concurrency=min(8, args.sessions), queue_size=64,
                           max_model_len=args.max_model_len, prefill_chunk_tokens=512, prefix_cache=cache)
        with Engine(args.model, cfg) as eng:
            assert eng.wait_ready(600).ready, eng.availability.reason
            results[cache] = replay(eng, args.sessions, args.turns, args.max_tokens, not args.no_session)
    same = results[True]["outputs"] == results[False]["outputs"]
    rows = [["off" if not c else "on", r["hit_rate"], r["token_hit_rate"], r["reused_tokens"], r["prompt_tokens"],
             r["ttft_mean_s"] * 1e3, r["ttft_p50_s"] * 1e3, r["wall_s"]] for c, r in results.items()]
    print_table(["cache", "hit rate", "token hit rate", "reused", "prompt tok", "TTFT mean ms", "TTFT p50 ms",
                 "wall s"], rows)
    print(f"greedy outputs identical with and without the cache: {same}")
    json_line("prefix_cache", dict(env=env_record(), model=args.model, sessions=args.sessions, turns=args.turns,
                                   max_tokens=args.max_tokens, identical=same,
                                   **{f"{'on' if c else 'off'}_{k}": v for c, r in results.items()
                                      for k, v in r.items() if k != "outputs"}))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
