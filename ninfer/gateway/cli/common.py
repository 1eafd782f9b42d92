"""Shared CLI pieces: model resolution (a .ninfer path, a Hugging Face checkpoint directory converted
once into the cache, or the built-in demo), Engine flags that mirror `EngineConfig` field names one
to one (`speculative` as vLLM spells its flags: --speculative-method, --num-speculative-tokens),
sampling flags and terminal styling."""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from ninfer.gateway.cli.main import CLIError
from ninfer.config import MAX_SPECULATIVE_TOKENS, SPECULATIVE_METHODS, EngineConfig, Purpose, SpeculativeConfig

_ENGINE_HELP = {
    "device": "auto | cpu | cuda | cuda:N",
    "dtype": "auto | bf16 | fp32 (auto: bf16 on CUDA, fp32 on CPU)",
    "max_concurrency": "active requests at once (1..8)",
    "queue_size": "bounded FIFO waiting queue; a full queue refuses requests (HTTP 429)",
    "request_timeout_s": "how long a request may wait in the queue",
    "prefill_chunk_tokens": "staged prefill size in tokens",
    "page_size": "KV page size (16, 32, 64, 128, 256)",
    "num_pages": "KV pages (0 = derived from --kv-memory-fraction and --max-model-len)",
    "kv_memory_fraction": "share of the memory left after the weights (CUDA: free device memory; CPU: available "
                          "host memory) for KV pages when --num-pages is 0",
    "max_model_len": "prompt + output limit of one request (0 = auto: the model's native length when the KV pool "
                     "holds one sequence of it, else the longest it holds)",
    "enforce_eager": "no CUDA graphs",
    "decode_step_ahead": "decode rounds through the CUDA graphs launch the next step before waiting for "
                         "their own tokens (rows without penalties, logit bias or log-probs)",
    "seed": "the run's seed: requests without their own seed draw reproducible streams from it",
    "prefix_cache": "context cache: reuse checkpoints of earlier prompts and conversation turns",
    "cache_slots": "StateImage slots for inactive checkpoints (-1 = 2 x --max-concurrency)",
    "cache_device_bytes": "device memory budget of inactive checkpoints in bytes (0 = bounded by the pools)",
    "cache_host_bytes": "host-memory replica budget of inactive checkpoints in bytes (0 = none)",
    "cache_capture_stride": "also capture a checkpoint every N prompt tokens (0 = off)",
    "load_format": "artifact | dummy (dummy: seeded random weights of --identity, for benchmarks; outputs are meaningless)",
    "identity": "registered model identity for --load-format dummy (qwen3_6-27b, qwen3_6-35b-a3b, qwen3_6-tiny-dense, ...)",
}

SYNTHETIC_NOTICE = ("note: --load-format dummy: {identity} with synthetic random weights (a benchmarking aid): "
                    "its text is meaningless and every response is marked synthetic")


class _ModelAction(argparse.Action):
    """MODEL given as the positional or as --model (vLLM's spelling), once: both name one setting."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None:                  # the positional left out: keep what --model gave
            return
        given = getattr(namespace, self.dest, None)
        if given is not None and given != values:
            parser.error(f"the model is given twice ({given} and {values}); pass one")
        setattr(namespace, self.dest, values)


def add_model_arg(p: argparse.ArgumentParser) -> None:
    help_ = ("a .ninfer artifact, or a Hugging Face checkpoint directory (converted once into the user "
             "cache, then loaded from there) (default: the built-in demo model, random weights)")
    p.add_argument("model", nargs="?", default=None, metavar="MODEL", action=_ModelAction, help=help_)
    p.add_argument("--model", dest="model", default=None, metavar="MODEL", action=_ModelAction,
                   help="the same as the positional MODEL")


def add_engine_args(p: argparse.ArgumentParser, skip: tuple[str, ...] = (), *, force_accept_len: bool = False) -> None:
    """One flag per EngineConfig field (`max_concurrency` -> `--max-concurrency`); `speculative` is
    --speculative-method and --num-speculative-tokens (with force_accept_len also --force-accept-len)."""
    g = p.add_argument_group("engine (EngineConfig)")
    for f in dataclasses.fields(EngineConfig):
        if f.name == "purpose" or f.name in skip:
            continue
        if f.name == "speculative":
            add_speculative_args(g, force_accept_len=force_accept_len)
            continue
        flag = "--" + f.name.replace("_", "-")
        help_ = f"{_ENGINE_HELP.get(f.name, f.name)} (default: {f.default})"
        if isinstance(f.default, bool) and f.default:
            # NOTE: a feature on by default is turned off by --no-<field> (e.g. --no-prefix-cache).
            g.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false", default=True,
                           help=f"turn off: {_ENGINE_HELP.get(f.name, f.name)}")
        elif isinstance(f.default, bool):
            g.add_argument(flag, dest=f.name, action="store_true", default=f.default, help=help_)
        else:
            g.add_argument(flag, dest=f.name, type=type(f.default), default=f.default, help=help_)


def add_speculative_args(g, *, force_accept_len: bool = False, force_accept_help: str | None = None,
                         force_accept_nargs: str | None = None) -> None:
    """--speculative-method, --num-speculative-tokens and (force_accept_len) --force-accept-len; parsed by
    `speculative_config` (values are checked there, so that a bad one is a one-line error)."""
    g.add_argument("--speculative-method", default=None, metavar="METHOD",
                   help=f"speculative decoding: {' | '.join(SPECULATIVE_METHODS)} (mtp: the checkpoint's MTP layer "
                        f"drafts, the model verifies every draft; lossless) (default: off)")
    g.add_argument("--num-speculative-tokens", default=None, metavar="K",
                   help=f"drafts per speculative round, 1..{MAX_SPECULATIVE_TOKENS} (with --speculative-method; "
                        f"every request reserves K positions of --max-model-len)")
    g.add_argument("--draft-vocab-size", default=None, metavar="N",
                   help="drafts are the argmax over the first N token ids (the frequent ones): each draft step "
                        "reads N rows of the output head instead of all; lossless at any N (default: all)")
    if force_accept_len:
        g.add_argument("--force-accept-len", default=None, metavar="L", nargs=force_accept_nargs,
                       help=force_accept_help or "benchmarking aid for synthetic weights: every speculative round "
                            "keeps exactly L tokens (1..K+1) whatever the model says; verify and commit run in full")


def _int_flag(flag: str, value, lo: int, hi: int, what: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise CLIError(f"{flag} must be an integer in {what}, got {value!r}") from None
    if not lo <= n <= hi:
        raise CLIError(f"{flag} must be an integer in {what}, got {n}")
    return n


def speculative_config(args: argparse.Namespace) -> SpeculativeConfig | None:
    """The speculative flags as a SpeculativeConfig (None: off); CLIError names the flag at fault."""
    method = getattr(args, "speculative_method", None)
    k = getattr(args, "num_speculative_tokens", None)
    forced = getattr(args, "force_accept_len", None)
    vocab = getattr(args, "draft_vocab_size", None)
    if method is None:
        if vocab is not None:
            raise CLIError(f"--draft-vocab-size needs --speculative-method ({' | '.join(SPECULATIVE_METHODS)})")
        if k is not None:
            raise CLIError(f"--num-speculative-tokens needs --speculative-method ({' | '.join(SPECULATIVE_METHODS)})")
        if forced is not None:
            raise CLIError(f"--force-accept-len needs --speculative-method ({' | '.join(SPECULATIVE_METHODS)}) "
                           f"and --num-speculative-tokens")
        return None
    if method not in SPECULATIVE_METHODS:
        raise CLIError(f"--speculative-method must be one of {', '.join(SPECULATIVE_METHODS)}, got {method!r}")
    if k is None:
        raise CLIError(f"--speculative-method {method} needs --num-speculative-tokens K (1..{MAX_SPECULATIVE_TOKENS})")
    k = _int_flag("--num-speculative-tokens", k, 1, MAX_SPECULATIVE_TOKENS, f"1..{MAX_SPECULATIVE_TOKENS}")
    forced = 0 if forced is None else _int_flag("--force-accept-len", forced, 0, k + 1,
                                                f"0..{k + 1} (0: off; at most --num-speculative-tokens + 1)")
    vocab = 0 if vocab is None else _int_flag("--draft-vocab-size", vocab, 0, 1 << 24, "0.. (0: all)")
    return SpeculativeConfig(method, k, forced, vocab)


def engine_config(args: argparse.Namespace, purpose: Purpose = Purpose.GENERATION) -> EngineConfig:
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)
          if f.name not in ("purpose", "speculative") and hasattr(args, f.name)}
    kw["speculative"] = speculative_config(args)
    try:
        config = EngineConfig(purpose=purpose, **kw)
    except ValueError as e:
        raise CLIError(f"invalid engine setting: {e}") from None
    if config.device.startswith("cuda"):
        from ninfer.engine.facade import check_device       # NOTE: before a model is resolved, built or loaded
        try:
            check_device(config)
        except ValueError as e:
            why = str(e).partition(": ")[2].replace("use device", "use --device")
            raise CLIError(f"--device {config.device}: {why}") from None
    return config


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=max_tokens, help=f"output token limit (default: {max_tokens})")
    g.add_argument("--temperature", type=float, default=None, help="0 = greedy (default: the model's generation_config, else 1.0)")
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None, help="0 = off")
    g.add_argument("--min-p", type=float, default=None)
    g.add_argument("--repetition-penalty", type=float, default=None)
    g.add_argument("--presence-penalty", type=float, default=None)
    g.add_argument("--frequency-penalty", type=float, default=None)
    g.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")


def sampling_params(args: argparse.Namespace, defaults: dict | None = None):
    """Flags given on the command line, else the model's generation_config defaults, else ours."""
    from ninfer.config import SamplingParams

    kw = dict(defaults or {})
    for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty"):
        value = getattr(args, name, None)
        if value is not None:
            kw[name] = value
    try:
        return SamplingParams(**kw)     # unseeded: the stream comes from EngineConfig.seed (--seed)
    except ValueError as e:
        raise CLIError(f"invalid sampling setting: {e}") from None


def check_max_tokens(n: int) -> int:
    if n < 1:
        raise CLIError(f"--max-tokens must be >= 1, got {n}")
    return n


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------
def resolve_model(model: str | None, quiet: bool = False,
                  config: EngineConfig | None = None) -> tuple[Path | None, str, bool]:
    """(artifact path, served model name, is_demo). Builds the demo artifact on first use.

    With `config.load_format == "dummy"` there is no file: (None, "<identity>-dummy", False).
    """
    if config is not None and config.load_format == "dummy":
        if model is not None:
            raise CLIError(f"--load-format dummy takes no MODEL file (got {model}); the model is --identity")
        if not quiet:
            print(SYNTHETIC_NOTICE.format(identity=config.identity), file=sys.stderr, flush=True)
        return None, f"{config.identity}-dummy", False
    if model is None:
        from ninfer.demo import DEMO_MODEL_NAME, DEMO_NOTICE, ensure_demo_artifact

        def building(path: Path) -> None:
            if not quiet:
                print(f"building the demo model in {path} (first use only) ...", file=sys.stderr, flush=True)

        path = ensure_demo_artifact(on_build=building)
        if not quiet:
            print(DEMO_NOTICE, file=sys.stderr, flush=True)
        return path, DEMO_MODEL_NAME, True
    path = Path(model).expanduser()
    if not path.exists():
        raise CLIError(f"model file not found: {model}")
    if path.is_dir():
        return converted_checkpoint(path, quiet), path.resolve().name, False
    return path, path.name.removesuffix(".ninfer"), False


def converted_checkpoint(src: Path, quiet: bool = False) -> Path:
    """The `.ninfer` conversion of Hugging Face checkpoint directory `src` in the user cache, made on
    its first use (with a progress bar) and reused while the directory's content stays the same."""
    from ninfer.artifact import ArtifactError
    from ninfer.convert import ConvertError, ensure_converted

    t0 = time.monotonic()
    converted: list[Path] = []

    def converting(out: Path) -> None:
        converted.append(out)
        if not quiet:
            print(f"converting the checkpoint {src} into {out} (on its first use only) ...", file=sys.stderr,
                  flush=True)

    try:
        out = ensure_converted(src, progress=not quiet, on_convert=converting)
    except (ConvertError, ArtifactError) as e:
        inside = sorted(p.name for p in src.glob("*.ninfer"))
        hint = f"; it holds {inside[0]}: pass that file" if inside and not (src / "config.json").exists() else ""
        if "no space left" in str(e):
            hint = "; NINFER_CACHE_DIR names another place for the cache (the converted file is about the size " \
                   "of the checkpoint)"
        raise CLIError(f"{src}: {e}{hint}") from None
    if not quiet:
        done = f"converted in {time.monotonic() - t0:.1f} s" if converted else "converted earlier"
        print(f"using {out} ({done} from {src})", file=sys.stderr, flush=True)
    return out


def open_engine(path: Path | None, config: EngineConfig, quiet: bool = False):
    """Build the Engine and wait until the model is loaded, showing its progress on stderr (CLIError if it
    cannot start: the memory check's and the device's refusals as they are). With an automatic
    max_model_len, a line on stderr says which and why (`Engine.max_model_len_note`; not when `quiet`).
    path None: `config` names the model (load_format dummy)."""
    try:
        from ninfer import Engine
    except ImportError as e:                                  # pragma: no cover - broken install
        raise CLIError(f"the NInfer engine is not available: {e}") from None
    from ninfer.engine.facade import DeviceUnavailableError, InsufficientMemoryError
    try:
        engine = Engine(path, config)
    except (DeviceUnavailableError, InsufficientMemoryError) as e:
        raise CLIError(str(e)) from None
    except (OSError, ValueError) as e:
        raise CLIError(f"cannot load {path or config.identity}: {e}") from None
    availability = wait_ready_reporting(engine)
    if not availability.ready:
        engine.close(0.0)
        raise CLIError(f"cannot start the engine for {path or config.identity}: "
                       f"{availability.reason or availability.state.value}")
    if config.max_model_len == 0 and not quiet:
        print(engine.max_model_len_note, file=sys.stderr, flush=True)
    return engine


def wait_ready_reporting(engine, stream=None, *, after_s: float = 2.0, every_s: float = 10.0):
    """engine.wait_ready(), printing the load's progress (`Engine.progress`) on `stream` (stderr) once it has
    taken `after_s`: a line each `every_s` seconds, or one line kept up to date on a terminal."""
    from ninfer.engine.startup import progress_line

    stream = stream or sys.stderr
    tty = hasattr(stream, "isatty") and stream.isatty()
    t0, shown, last = time.monotonic(), False, 0.0
    while True:
        availability = engine.wait_ready(0.5)
        if availability.state.value != "starting":
            if shown and tty:
                stream.write("\n")
            return availability
        now = time.monotonic() - t0
        p = engine.progress()
        if p is None or now < after_s or (not tty and shown and now - last < every_s):
            continue
        stream.write(("\r\x1b[2K" if tty else "") + progress_line(p) + ("" if tty else "\n"))
        stream.flush()
        shown, last = True, now


# ---------------------------------------------------------------------------------------------
# Terminal
# ---------------------------------------------------------------------------------------------
def use_color(stream) -> bool:
    return hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("NO_COLOR")


def dim(text: str, on: bool) -> str:
    return f"\x1b[2m{text}\x1b[0m" if on and text else text


def usage_line(result, ttft_s: float | None, elapsed_s: float) -> str:
    u = result.usage
    rate = u.num_output_tokens / elapsed_s if elapsed_s > 0 else 0.0
    ttft = f"{ttft_s:.3f}s" if ttft_s is not None else "-"
    spec = ""
    if u.num_spec_rounds is not None:
        mal = u.mean_acceptance_length
        spec = f" spec_rounds={u.num_spec_rounds} mean_acceptance_length={'-' if mal is None else format(mal, '.2f')}"
    return (f"[usage] prompt_tokens={u.num_prompt_tokens} cached_tokens={u.num_reused_tokens} "
            f"output_tokens={u.num_output_tokens} reasoning_tokens={u.num_reasoning_tokens} "
            f"finish_reason={result.finish_reason.value} ttft={ttft} tokens/s={rate:.1f}{spec}")


def output_room(engine, num_prompt_tokens: int) -> int:
    """The most output tokens a prompt leaves: max_model_len less the prompt and the speculative lookahead."""
    return engine.max_model_len - getattr(engine, "lookahead", 0) - num_prompt_tokens


def room_note(engine) -> str:
    """How max_model_len is spent besides the prompt, for error lines ("" without speculation)."""
    look = getattr(engine, "lookahead", 0)
    return f" ({look} of them reserved for speculative decoding)" if look else ""
