"""What a prompt length the serve warmup did not cover costs the first time: an Engine (synthetic
weights, the server's defaults) runs its serve warmup (`Engine.warm_up`, default lengths or
--warmup-lengths), then for each --lengths L two requests of fresh random prompts of L tokens one after
another (2 output tokens, the context cache on as in `ninfer serve`), and prints the first and the second
TTFT: their difference is first-use work (Triton compiles of a new specialisation, graph captures,
autotuning, library plans) that a server's first request of that length would wait for.
Meaningful only with a compile cache that holds no earlier run's kernels (TRITON_CACHE_DIR fresh; the
autotuning results may be kept).

--prefix R:N adds context-cache hits, a chat's next turn: a fresh prompt of R tokens and its output, then
that prompt + output + N new tokens, which reuses the first request's end state, so its prefill is a
stage of about N tokens over a prefix of about R (through a prefill graph when N fits one, since session
20); the same again with another fresh prompt gives the warm figure. Each compile a first use triggers
is printed with the arguments whose specialisation (Triton's type / divisible-by-16 / == 1 key) differs
from the nearest earlier compile of that kernel, which names what the warmup missed.

    PYTHONPATH=$PWD python3 bench/first_use.py --identity qwen3_6-35b-a3b --lengths 5 100 1023 4001 8000 \
        --prefix 1000:300 2999:7
"""
from __future__ import annotations

import argparse
import json
import random
import time

from ninfer.bench.args import prefix_turn
from ninfer.bench.serve import _prompt, engine_request


def _facets(c: dict) -> dict[str, str]:
    """A compile's specialisation, one entry per argument (its type, its value if constexpr, its
    divisibility / == 1 attribute) and per compile option, from the hook's `compile` record."""
    names = list(c["signature"])
    out = {n: str(t) for n, t in c["signature"].items()}
    for path, v in c["constants"].items():
        out[names[path[0]]] += f" = {v}"
    for path, v in c["configs"][0].items():
        out[names[path[0]]] += f" {v}"
    try:
        opts = json.loads(c["specialization_data"])["options"]
    except (KeyError, TypeError, ValueError):
        opts = {k: c.get(k) for k in ("num_warps", "num_ctas", "num_stages")}
    out.update({f"option {k}": str(v) for k, v in opts.items()})
    return out


def _log_compiles() -> list[tuple[str, dict]]:
    """Every Triton kernel this process compiles (or loads from the disk cache) from now on, as (name,
    its specialisation `_facets`), through Triton's post-compile hook."""
    out: list[tuple[str, dict]] = []
    try:
        from triton import knobs
    except ImportError:
        return out

    def hook(**kw) -> None:
        name = kw["repr"].split("[", 1)[0]
        try:
            out.append((name, _facets(kw["compile"])))
        except Exception as exc:          # a Triton whose record differs: the name alone
            out.append((name, {"(record unread)": repr(exc)}))
    knobs.runtime.jit_post_compile_hook = hook
    return out


def _what_differs(new: tuple[str, dict], earlier: list[tuple[str, dict]]) -> str:
    """What a compile's specialisation has that the nearest earlier compile of the same kernel had not."""
    same = [f for name, f in earlier if name == new[0]]
    if not same:
        return "no earlier compile of this kernel"
    best = min(same, key=lambda f: sum(f.get(k) != v for k, v in new[1].items()))
    diff = [f"{k}: {v} (was {best.get(k)})" for k, v in new[1].items() if best.get(k) != v]
    return "differs in " + "; ".join(diff) if diff else "the same specialisation as an earlier compile"


def _report(label: str, first: float, second: float, since: int, compiled: list) -> dict:
    new = compiled[since:]
    print(f"  {label}: first TTFT {first:9.1f} ms, second {second:7.1f} ms, first use {first - second:8.1f} ms; "
          f"{len(new)} Triton kernels compiled or loaded", flush=True)
    for c in new[:8]:
        print(f"      {c[0]}: {_what_differs(c, compiled[:since])}"[:400], flush=True)
    return dict(first_ms=first, second_ms=second, first_use_ms=first - second,
                compiled=[dict(kernel=n, **f) for n, f in new])


def _next_turn(engine, rng: random.Random, R: int, N: int) -> float:
    """TTFT of a chat's next turn: a fresh prompt of R tokens and its 2 output tokens, then that prompt +
    output + N new tokens, which reuses the first request's end state (its terminal checkpoint) and so
    prefills a stage of about N tokens over a prefix of about R."""
    base = _prompt(rng, R)
    first = engine_request(engine, base, 2)
    r = engine_request(engine, base + list(first["token_ids"]) + _prompt(rng, N), 2)
    if r["reused_tokens"] < R:
        raise SystemExit(f"--prefix {R}:{N}: the next turn reused {r['reused_tokens']} tokens, fewer than {R}")
    return r["ttft_ms"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", default="qwen3_6-35b-a3b")
    ap.add_argument("--lengths", nargs="+", type=int, default=[5, 100, 1023, 4001, 8000])
    ap.add_argument("--warmup-lengths", nargs="*", type=int, default=None,
                    help="Engine.warm_up lengths (default: the Program's own)")
    ap.add_argument("--prefix", nargs="*", type=prefix_turn, default=[], metavar="R:N",
                    help="context-cache hits: R reused prompt tokens, N new ones (see above)")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    from ninfer.engine.facade import Engine
    from ninfer.config import EngineConfig

    compiled = _log_compiles()          # from the start: the warmup's compiles are what a first use is diffed against
    t0 = time.perf_counter()
    engine = Engine.from_config(EngineConfig(load_format="dummy", identity=a.identity, device=a.device,
                                             max_model_len=a.max_model_len))
    rows, done = [], []
    try:
        avail = engine.wait_ready(900)
        if not avail.ready:
            raise SystemExit(f"engine not ready: {avail.reason}")
        ready = time.perf_counter() - t0
        done = engine.warm_up(a.warmup_lengths)
        print(f"[{a.identity}] ready in {ready:.1f} s; warmup {sum(t for _, t in done):.1f} s over "
              f"{[n for n, _ in done]}", flush=True)
        rng = random.Random(0)
        for L in a.lengths:
            since = len(compiled)
            first = engine_request(engine, _prompt(rng, L), 2)["ttft_ms"]
            second = engine_request(engine, _prompt(rng, L), 2)["ttft_ms"]
            rows.append(dict(prompt=L, **_report(f"prompt {L:5d}", first, second, since, compiled)))
        for R, N in a.prefix:
            since = len(compiled)
            first = _next_turn(engine, rng, R, N)
            second = _next_turn(engine, rng, R, N)
            rows.append(dict(prefix=R, new=N, **_report(f"prefix {R:5d} + {N:5d}", first, second, since, compiled)))
    finally:
        engine.close()
    print("JSON " + json.dumps(dict(bench="first_use", identity=a.identity, warmup_lengths=a.warmup_lengths,
                                    warmup=[list(d) for d in done], rows=rows)))


if __name__ == "__main__":
    main()
