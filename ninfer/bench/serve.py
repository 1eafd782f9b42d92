"""End-to-end serving benchmark through the OpenAI API, synthetic (dummy) weights.

    ninfer bench serve [--identity qwen3_6-27b] [--concurrency 1 2 4 8] [--prompt-len 1024]
        [--output-len 128] [--requests-per-client 2] [--out DIR] [--step-timeout S]
        [--speculative-method mtp --num-speculative-tokens K [--force-accept-len L ...] [--with-plain]]
    (or: python3 -m ninfer.bench.serve ...)

Per identity: starts `ninfer serve --load-format dummy --identity X` as a subprocess on a free
loopback port (`--max-concurrency` = the largest concurrency, `--max-model-len` = this bench's
--max-model-len, at least prompt + output + 16), waits for /health, checks that /v1/models says `synthetic_weights`, sends one warm-up
request (first-call compiles), then for each concurrency c runs c clients, each sending
--requests-per-client streaming completions one after another: a fresh random prompt of exactly
--prompt-len token ids (no prefix reuse), temperature 0 (--temperature / --top-p / --top-k), `max_tokens` = --output-len with
`ignore_eos` so every output has the asked length. The clients (`--client http`, the default) post
the OpenAI request JSON over one shared `httpx.AsyncClient` and read the SSE lines themselves, as
vLLM's and SGLang's serving benches do with aiohttp. `--client openai` uses the official `openai`
async client instead; its client-side work counts in the TTFT (docs/performance.md, "Decision log").
`--client http openai` runs each level once per client, one after the other, against the same server
(one warm-up request per client first); each row's `path` names its client.

Per request: TTFT = first streamed chunk with a choice - send time; TPOT = (last chunk - first
chunk) / (output tokens - 1). Per level: TTFT mean/p50/p99, TPOT mean/p50/p99, output tokens/s =
all output tokens / wall time of the level. Floors (performance.md, ceilings measured in this
run): TTFT >= prefill FLOPs / matmul rate; TPOT >= decode bytes at batch c and the mean context /
copy bandwidth; tokens/s <= c / TPOT floor.

Speculative decoding: the speculative flags go to the server (`ninfer serve --speculative-method mtp
--num-speculative-tokens K [--force-accept-len L]`, L keeping exactly L tokens per round on synthetic
weights); each level then reports `mean_acceptance_length`, the tokens per speculative round over the
level, from the server's `ninfer:spec_decode_*` counters on /metrics read before and after it (in
process: from `Engine.metrics()`). max_model_len also holds the K positions every request reserves.
Several --force-accept-len values start one server each; --with-plain first runs one without
speculation, all in the same run.

`--in-process` drives the same workload through the public `Engine` in this process instead
(`Engine.from_config(load_format="dummy")`, `Frontend.prepare_tokens`, one thread per client
reading its handle's events): no HTTP, SSE or JSON. The difference to the HTTP run is what the
gateway adds. It also records `admit_ms` (GenerationStart - submit: queueing until a lane runs the
request), so TTFT splits into waiting and prefill.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from ninfer.bench.args import serve_args
from ninfer.bench.common import (decode_floor_ms, default_device, measure_ceilings, measure_ceilings_apart,
                                 prefill_floor_ms, print_table, Recorder, start_run)
from ninfer.bench.engine_clock import acceptance_length, spec_fields, spec_header, spec_label

TOKEN_RANGE = (1000, 150000)      # ordinary text tokens of the Qwen3.6 vocabulary (no special ids)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"{}")
        except Exception:
            return e.code, {}


class Server:
    """`ninfer serve --load-format dummy` in a subprocess (its own process group), log to a file."""

    def __init__(self, identity: str, *, max_concurrency: int, max_model_len: int, device: str | None,
                 log_path: Path, extra: list[str]):
        self.port = free_port()
        self.name = f"{identity}-dummy"
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "ninfer.gateway.cli.main", "serve", "--load-format", "dummy", "--identity", identity,
               "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", self.name,
               "--max-concurrency", str(max_concurrency), "--max-model-len", str(max_model_len),
               "--log-level", "warning", "--drain-timeout-s", "5", *(["--device", device] if device else []), *extra]
        self.cmd = cmd
        self._log = open(log_path, "wb")
        root = str(Path(__file__).resolve().parents[2])           # the tree holding `ninfer/` (uninstalled runs)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def wait_ready(self, timeout: float) -> None:
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                status, body = _get(self.url + "/health", timeout=2.0)
                if status == 200:
                    return
                if body.get("status") == "failed" or "fail" in json.dumps(body).lower():
                    raise RuntimeError(f"server failed to start: {body}")
            except (OSError, ValueError):
                pass
            time.sleep(0.1)                 # startup_s is read to this resolution
        raise TimeoutError(f"server not ready after {timeout:.0f} s: {self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def _kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)         # the group of the process we started
            self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill()
        except BaseException:
            self._kill()
            raise
        finally:
            self._log.close()


def spec_counters(url: str, timeout: float = 5.0) -> tuple[float, float] | None:
    """(drafts, accepted draft tokens) from the server's /metrics (the `ninfer:spec_decode_*` counters);
    None when it exposes none (speculation off)."""
    with urllib.request.urlopen(url + "/metrics", timeout=timeout) as r:
        text = r.read().decode("utf-8", "replace")
    values = {}
    for line in text.splitlines():
        for name in ("ninfer:spec_decode_num_drafts_total", "ninfer:spec_decode_num_accepted_tokens_total"):
            if line.startswith(name + "{") or line.startswith(name + " "):
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    if len(values) < 2:
        return None
    return values["ninfer:spec_decode_num_drafts_total"], values["ninfer:spec_decode_num_accepted_tokens_total"]


def counters_acceptance(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """Mean tokens per speculative round between two `spec_counters` readings (None: no round or no speculation)."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return 1.0 + (after[1] - before[1]) / (after[0] - before[0])


def _stream_state() -> dict:
    return {"first": None, "last": None, "n_out": None, "chunks": 0, "fingerprint": None}


def _chunk_record(chunk: dict, state: dict, now: float) -> None:
    """Fold one streamed completion chunk (a dict) into the request's timing state."""
    state["fingerprint"] = state["fingerprint"] or chunk.get("system_fingerprint")
    if chunk.get("choices"):
        state["chunks"] += 1
        if state["first"] is None:
            state["first"] = now
        state["last"] = now
    if chunk.get("usage"):
        state["n_out"] = chunk["usage"].get("completion_tokens")


def _request_row(state: dict, t0: float) -> dict:
    if state["first"] is None:
        raise RuntimeError("the stream carried no choice")
    n_out = state["n_out"] if state["n_out"] is not None else state["chunks"]
    first, last = state["first"], state["last"]
    return {"ttft_ms": (first - t0) * 1e3, "e2e_ms": (last - t0) * 1e3, "output_tokens": n_out,
            "tpot_ms": (last - first) * 1e3 / (n_out - 1) if n_out > 1 else None,
            "fingerprint": state["fingerprint"]}


STREAM_OPTIONS = {"include_usage": True}       # the last chunk carries the usage (output token count)
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}  # every request's (`run` sets them from --temperature ..)


def _body(model: str, prompt: list[int], output_len: int) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": output_len, **SAMPLING, "stream": True,
            "stream_options": STREAM_OPTIONS, "ignore_eos": True}


async def one_request_http(client, model: str, prompt: list[int], output_len: int) -> dict:
    """One streaming completion over raw HTTP (httpx.AsyncClient): SSE `data:` lines until [DONE]."""
    state = _stream_state()
    t0 = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=_body(model, prompt, output_len)) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            _chunk_record(chunk, state, time.perf_counter())
    return _request_row(state, t0)


async def one_request(client, model: str, prompt: list[int], output_len: int) -> dict:
    """The same through the official `openai` async client (`--client openai`)."""
    state = _stream_state()
    t0 = time.perf_counter()
    openai_sampling = {k: v for k, v in SAMPLING.items() if k != "top_k"}     # top_k is an extension field
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=output_len, **openai_sampling,
                                             stream=True, stream_options=STREAM_OPTIONS,
                                             extra_body={"ignore_eos": True, "top_k": SAMPLING["top_k"]})
    async for chunk in stream:
        _chunk_record(chunk.model_dump(exclude_none=True), state, time.perf_counter())
    return _request_row(state, t0)


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]


async def run_level(url: str, model: str, c: int, per_client: int, prompt_len: int, output_len: int,
                    rng: random.Random, client_kind: str = "http") -> tuple[list[dict], float]:
    if client_kind == "openai":
        from openai import AsyncOpenAI
        client = AsyncOpenAI(base_url=url + "/v1", api_key="ninfer-bench", timeout=600.0, max_retries=0)
        send = one_request
    else:
        import httpx
        client = httpx.AsyncClient(base_url=url, timeout=600.0,
                                   limits=httpx.Limits(max_connections=c, max_keepalive_connections=c))
        send = one_request_http
    async with client:
        async def worker() -> list[dict]:
            return [await send(client, model, _prompt(rng, prompt_len), output_len) for _ in range(per_client)]

        t0 = time.perf_counter()
        per_worker = await asyncio.gather(*(worker() for _ in range(c)))
        wall = time.perf_counter() - t0
    return [r for w in per_worker for r in w], wall


def engine_request(engine, prompt: list[int], output_len: int) -> dict:
    """One request through the public Engine (the in-process counterpart of `one_request`)."""
    from ninfer.contract.frontend import OutputOptions
    from ninfer.contract.program import SamplingParams
    from ninfer.config import GenerationDelta, GenerationError, GenerationResult, GenerationStart

    t0 = time.perf_counter()
    admit = first = last = None
    n_out = reused = 0
    out_ids: tuple[int, ...] = ()
    handle = engine.submit(engine.frontend.prepare_tokens(prompt), SamplingParams(**SAMPLING),
                           max_tokens=output_len, output=OutputOptions(ignore_eos=True))
    with handle:
        for ev in handle:
            now = time.perf_counter()
            if isinstance(ev, GenerationStart):
                admit, reused = now, ev.num_reused_tokens
            elif isinstance(ev, GenerationDelta) and ev.token_ids:
                first = first or now
                last = now
            elif isinstance(ev, GenerationResult):
                out_ids = tuple(ev.token_ids)
                n_out = len(out_ids)
            elif isinstance(ev, GenerationError):
                raise RuntimeError(f"{ev.kind.value}: {ev.message}")
    if first is None:
        raise RuntimeError("the request produced no token")
    return {"ttft_ms": (first - t0) * 1e3, "e2e_ms": (last - t0) * 1e3, "output_tokens": n_out,
            "tpot_ms": (last - first) * 1e3 / (n_out - 1) if n_out > 1 else None,
            "admit_ms": (admit - t0) * 1e3 if admit is not None else None,
            "reused_tokens": reused, "token_ids": out_ids,
            "fingerprint": "ninfer-synthetic-weights" if engine.synthetic else None}


def engine_level(engine, c: int, per_client: int, prompt_len: int, output_len: int, rng: random.Random,
                 timeout: float | None) -> tuple[list[dict], float]:
    """c client threads, each sending per_client requests one after another."""
    prompts = [[_prompt(rng, prompt_len) for _ in range(per_client)] for _ in range(c)]
    out: list[list[dict]] = [[] for _ in range(c)]
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            for p in prompts[i]:
                out[i].append(engine_request(engine, p, output_len))
        except BaseException as e:  # noqa: BLE001 - reported by the level
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(c)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(None if timeout is None else max(0.0, timeout - (time.perf_counter() - t0)))
    wall = time.perf_counter() - t0
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"level c={c} did not finish in {timeout:.0f} s")
    if errors:
        raise errors[0]
    return [r for rs in out for r in rs], wall


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q / 100 * (len(xs) - 1)))))]


def summarize(identity: str, c: int, reqs: list[dict], wall: float, prompt_len: int, output_len: int,
              ceil: dict, dtype_bytes: int, path: str = "http", spec=None,
              mean_acceptance_length: float | None = None) -> dict:
    from ninfer.targets.registry import lookup

    dims = lookup(identity).dims
    ttft = [r["ttft_ms"] for r in reqs]
    tpot = [r["tpot_ms"] for r in reqs if r["tpot_ms"] is not None]
    out_tokens = sum(r["output_tokens"] for r in reqs)
    tpot_floor = decode_floor_ms(dims, c, prompt_len + output_len // 2, ceil["copy_TBps"], dtype_bytes)
    admit = [r["admit_ms"] for r in reqs if r.get("admit_ms") is not None]
    return dict(identity=identity, kind="serve", path=path, concurrency=c, requests=len(reqs),
                prompt_len=prompt_len, admit_mean_ms=statistics.fmean(admit) if admit else None,
                output_len=output_len, output_tokens=out_tokens,
                all_outputs_full=all(r["output_tokens"] == output_len for r in reqs),
                synthetic_fingerprint=all(r["fingerprint"] == "ninfer-synthetic-weights" for r in reqs),
                ttft_mean_ms=statistics.fmean(ttft), ttft_p50_ms=_pct(ttft, 50), ttft_p99_ms=_pct(ttft, 99),
                ttft_floor_ms=prefill_floor_ms(dims, prompt_len, ceil["matmul_8192_TFLOPs"]),
                tpot_mean_ms=statistics.fmean(tpot) if tpot else None, tpot_p50_ms=_pct(tpot, 50),
                tpot_p99_ms=_pct(tpot, 99), tpot_floor_ms=tpot_floor, wall_s=wall,
                output_tokens_per_s=out_tokens / wall, tokens_per_s_ceiling=c * 1e3 / tpot_floor,
                **spec_fields(spec), mean_acceptance_length=mean_acceptance_length)


def client_path(client: str) -> str:
    """The `path` the rows of an HTTP run record for one --client: the raw client or the openai SDK."""
    return "http" if client == "http" else "openai-sdk"


def run_path(args) -> str:
    """The header's `path`: the one client's, or theirs joined with "+" when --client names several."""
    return "+".join(client_path(c) for c in args.client)


def model_len(args, spec=None) -> int:
    """The max_model_len the server (or the in-process Engine) runs with: --max-model-len, at least what
    one request needs (with speculation, its K reserved positions too)."""
    return max(args.max_model_len, args.prompt_len + args.output_len + 16 + (spec.lookahead if spec else 0))


def spec_server_args(spec) -> list[str]:
    """`ninfer serve` flags of the speculative settings."""
    if spec is None:
        return []
    return ["--speculative-method", spec.method, "--num-speculative-tokens", str(spec.num_speculative_tokens),
            "--force-accept-len", str(spec.force_accept_len)]


def bench_identity(identity: str, args, ceil: dict, device: str, rec: Recorder, log_dir: Path, spec=None) -> None:
    cuda = device.startswith("cuda")
    max_c = max(args.concurrency)
    tag = "" if spec is None else f"-{spec.method}-k{spec.num_speculative_tokens}-l{spec.force_accept_len}"
    log_path = log_dir / f"serve-{identity}{tag}.log"
    server = Server(identity, max_concurrency=max_c, max_model_len=model_len(args, spec),
                    device=device, log_path=log_path, extra=spec_server_args(spec) + list(args.server_arg or []))
    print(f"[{identity}] starting: {' '.join(server.cmd)} (log {log_path})", flush=True)
    rng = random.Random(0)
    try:
        t0 = time.perf_counter()
        server.wait_ready(args.startup_timeout)
        startup_s = time.perf_counter() - t0
        _, models = _get(server.url + "/v1/models")
        synthetic = bool(models.get("data") and models["data"][0].get("synthetic_weights"))
        print(f"[{identity}] ready in {startup_s:.1f} s; /v1/models synthetic_weights={synthetic}", flush=True)
        rec.add(dict(identity=identity, kind="startup", startup_s=startup_s, models_synthetic=synthetic))
        for client in args.client:
            t0 = time.perf_counter()
            asyncio.run(asyncio.wait_for(run_level(server.url, server.name, 1, 1, args.prompt_len,
                                                   min(args.output_len, 8), rng, client), args.step_timeout or None))
            print(f"[{identity}] {client_path(client)} warm-up request {time.perf_counter() - t0:.1f} s", flush=True)
        for c in args.concurrency:
            for client in args.client:
                level = f"{identity} {client_path(client)} concurrency {c}"
                try:
                    before = spec_counters(server.url) if spec is not None else None
                    reqs, wall = asyncio.run(asyncio.wait_for(
                        run_level(server.url, server.name, c, args.requests_per_client, args.prompt_len,
                                  args.output_len, rng, client), args.step_timeout or None))
                    accept = counters_acceptance(before, spec_counters(server.url)) if spec is not None else None
                except (asyncio.TimeoutError, TimeoutError):
                    rec.error(f"{level}: timed out after {args.step_timeout:.0f} s")
                    continue
                except Exception as e:  # noqa: BLE001 - keep the other levels
                    rec.error(f"{level}: failed: {type(e).__name__}: {e}")
                    continue
                row = summarize(identity, c, reqs, wall, args.prompt_len, args.output_len, ceil, 2 if cuda else 4,
                                path=client_path(client), spec=spec, mean_acceptance_length=accept)
                rec.add(row)
                _report(identity, row)
    finally:
        server.stop()


def _report(identity: str, row: dict) -> None:
    spec = ""
    if row.get("speculative_method"):
        accept = row["mean_acceptance_length"]
        spec = (f"; {row['speculative_method']} K={row['num_speculative_tokens']} L={row['force_accept_len']}, "
                f"acceptance length {'-' if accept is None else format(accept, '.2f')}")
    print(f"[{identity}] {row['path']} c={row['concurrency']}: TTFT mean {row['ttft_mean_ms']:.1f} ms "
          f"(floor {row['ttft_floor_ms']:.1f}), TPOT mean {row['tpot_mean_ms'] or 0:.2f} ms "
          f"(floor {row['tpot_floor_ms']:.2f}), {row['output_tokens_per_s']:.1f} tok/s{spec}", flush=True)


def bench_identity_in_process(identity: str, args, ceil: dict, device: str, rec: Recorder, spec=None) -> None:
    """The same levels through the public Engine in this process (no HTTP)."""
    from ninfer.engine.facade import Engine
    from ninfer.config import EngineConfig

    cuda = device.startswith("cuda")
    cfg = EngineConfig(load_format="dummy", identity=identity, device=device,
                       max_concurrency=max(args.concurrency), max_model_len=model_len(args, spec), speculative=spec)
    rng = random.Random(0)
    t0 = time.perf_counter()
    engine = Engine.from_config(cfg)
    try:
        avail = engine.wait_ready(args.startup_timeout)
        if not avail.ready:
            raise RuntimeError(f"engine not ready: {avail.reason}")
        done = engine.warm_up()                  # NOTE: as `ninfer serve` does before /health says ready
        startup_s = time.perf_counter() - t0
        print(f"[{identity}] engine ready in {startup_s:.1f} s (in process; serve warmup: {len(done)} prompts, "
              f"{sum(t for _, t in done):.1f} s)", flush=True)
        rec.add(dict(identity=identity, kind="startup", path="engine", startup_s=startup_s,
                     models_synthetic=engine.synthetic))
        t0 = time.perf_counter()
        engine_level(engine, 1, 1, args.prompt_len, min(args.output_len, 8), rng, args.step_timeout or None)
        print(f"[{identity}] warm-up request {time.perf_counter() - t0:.1f} s", flush=True)
        for c in args.concurrency:
            try:
                before = engine.metrics()
                reqs, wall = engine_level(engine, c, args.requests_per_client, args.prompt_len, args.output_len,
                                          rng, args.step_timeout or None)
                accept = acceptance_length(before, engine.metrics())
            except Exception as e:  # noqa: BLE001 - keep the other levels
                rec.error(f"{identity} concurrency {c}: failed: {type(e).__name__}: {e}")
                continue
            row = summarize(identity, c, reqs, wall, args.prompt_len, args.output_len, ceil, 2 if cuda else 4,
                            path="engine", spec=spec, mean_acceptance_length=accept)
            rec.add(row)
            _report(identity, row)
    finally:
        engine.close()


add_args = serve_args


def _terminated(signum, frame):
    raise SystemExit(128 + signum)       # unwinds through bench_identity's `finally`: the server is stopped


def run(args: argparse.Namespace) -> int:
    from ninfer.bench.args import speculative_configs
    specs = speculative_configs(args)
    speculative = any(s is not None for s in specs)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)     # an outer `timeout` must not leave the server running
    device = args.device or default_device()
    SAMPLING.update(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    env, ceil = start_run(lambda: measure_ceilings_apart(device) if args.in_process else measure_ceilings(device))
    if device.startswith("cuda"):
        import torch
        torch.cuda.empty_cache()
    rec = Recorder("serve", args.out, {"env": env, "ceilings": ceil, "device": device,
                                       "dtype": "bf16" if device.startswith("cuda") else "fp32",
                                       "weights": "dummy (synthetic)", "identities": args.identity,
                                       "concurrency": args.concurrency, "prompt_len": args.prompt_len,
                                       "output_len": args.output_len, "requests_per_client": args.requests_per_client,
                                       "max_model_len": max(model_len(args, spec) for spec in specs),
                                       "sampling": dict(SAMPLING),
                                       "path": "engine" if args.in_process else run_path(args),
                                       **spec_header(specs)})
    log_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ninfer-bench-serve-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    for ident in args.identity:
        for spec in specs:          # NOTE: one server (Engine) each: the speculative settings are fixed at start
            try:
                if args.in_process:
                    bench_identity_in_process(ident, args, ceil, device, rec, spec)
                else:
                    bench_identity(ident, args, ceil, device, rec, log_dir, spec)
            except Exception as e:  # noqa: BLE001 - the next identity still runs
                rec.error(f"{ident}{spec_label(spec)}: {type(e).__name__}: {e}")
    print()
    rows = [[r["identity"], r["path"], r["concurrency"], r["requests"], r["admit_mean_ms"], r["ttft_mean_ms"],
             r["ttft_p50_ms"], r["ttft_p99_ms"], r["ttft_floor_ms"], r["tpot_mean_ms"], r["tpot_p50_ms"],
             r["tpot_p99_ms"], r["tpot_floor_ms"], r["output_tokens_per_s"], r["tokens_per_s_ceiling"]]
            + ([r["num_speculative_tokens"], r["force_accept_len"], r["mean_acceptance_length"]] if speculative else [])
            for r in rec.results if r["kind"] == "serve"]
    print_table(["identity", "path", "conc", "reqs", "admit_mean", "ttft_mean", "ttft_p50", "ttft_p99", "ttft_floor",
                 "tpot_mean", "tpot_p50", "tpot_p99", "tpot_floor", "out_tok/s", "tok/s_ceil"]
                + (["K", "L", "accept_len"] if speculative else []), rows)
    rec.finish()
    return 1 if rec.errors else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ninfer bench serve", description=__doc__.split("\n\n")[0])
    add_args(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
