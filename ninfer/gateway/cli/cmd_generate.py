"""`ninfer generate [MODEL] -p PROMPT`: stream one generation to stdout.

Content goes to stdout; reasoning (thinking) goes to stderr, dimmed on a terminal, so that
`ninfer generate ... > out.txt` keeps only the answer. A usage line ends on stderr.
`--image PATH` (repeatable) and `--video PATH` (with --chat) put images and a video before the prompt
in the user message. `--json-schema FILE`, `--regex RE` or `--choice TEXT` (repeatable) constrain the
answer (with --chat and thinking on, the answer after the reasoning). `--json` prints one JSON object (text, reasoning, tool_calls, finish_reason, usage) instead; with
speculative decoding its usage also has num_spec_rounds, num_spec_accepted_tokens and
mean_acceptance_length (tokens per round).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from ninfer.gateway.cli.common import (add_engine_args, add_model_arg, add_sampling_args, check_max_tokens, dim,
                               engine_config, open_engine, output_room, resolve_model, room_note, sampling_params,
                               usage_line, use_color)
from ninfer.gateway.cli.main import CLIError


def add_parser(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)
    p.add_argument("-p", "--prompt", required=True, help="the prompt ('-' reads it from stdin)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as one user message with the chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--think", choices=("on", "off"), default="on",
                   help="thinking mode of the chat template (with --chat; default: on)")
    p.add_argument("--image", action="append", default=[], metavar="PATH",
                   help="an image file (PNG, JPEG, WebP, GIF, BMP) before the prompt (with --chat; repeatable)")
    p.add_argument("--video", action="append", default=[], metavar="PATH",
                   help="a video file (MP4, WebM) before the prompt (with --chat)")
    p.add_argument("--thinking-budget", type=int, default=None, metavar="N",
                   help="with --chat and --think on: close the reasoning after N tokens and answer (default: no cap)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    g = p.add_argument_group("controlled output (one of them)")
    g.add_argument("--json-schema", default=None, metavar="FILE",
                   help="the answer is JSON valid against the JSON schema in FILE ('-' reads stdin)")
    g.add_argument("--regex", default=None, metavar="RE", help="the answer matches the regular expression RE")
    g.add_argument("--choice", action="append", default=None, metavar="TEXT",
                   help="the answer is exactly one of these texts (repeatable)")
    add_sampling_args(p, max_tokens=256)
    add_engine_args(p)


def media_parts(images: list[str], videos: list[str]) -> list[dict]:
    """Decoded image/video content parts of files named on the command line (CLIError: one line)."""
    from ninfer.gateway.media import MEDIA_KEY, MediaError, MediaPolicy, load_file

    policy = MediaPolicy()
    parts = []
    for kind, paths in (("image", images), ("video", videos)):
        for path in paths:
            try:
                item = load_file(kind, path, policy)
            except MediaError as e:
                raise CLIError(f"--{kind} {path}: {e}") from None
            parts.append({"type": kind, kind: item.source, MEDIA_KEY: item})
    return parts


def output_constraint(args: argparse.Namespace):
    """The OutputConstraint of --json-schema / --regex / --choice (None: free output); CLIError on a
    file that cannot be read or more than one of them."""
    from ninfer.contract.frontend import OutputConstraint

    given = [flag for flag, value in (("--json-schema", args.json_schema), ("--regex", args.regex),
                                      ("--choice", args.choice)) if value is not None]
    if len(given) > 1:
        raise CLIError(f"give one of --json-schema, --regex, --choice (got {' and '.join(given)})")
    if args.json_schema is not None:
        if args.json_schema == "-" and args.prompt == "-":
            raise CLIError("--json-schema - and -p - cannot both read stdin")
        try:
            text = sys.stdin.read() if args.json_schema == "-" else open(args.json_schema, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as e:
            raise CLIError(f"--json-schema {args.json_schema}: {getattr(e, 'strerror', None) or e}") from None
        return OutputConstraint("json_schema", text, "--json-schema")
    if args.regex is not None:
        return OutputConstraint("regex", args.regex, "--regex")
    if args.choice is not None:
        return OutputConstraint("choice", json.dumps(args.choice, ensure_ascii=False), "--choice")
    return None


def compile_constraint(frontend, constraint) -> None:
    """Compile the constraint (None: nothing to do); one CLIError line naming the flag if it does not compile."""
    from ninfer.contract.frontend import ConstraintError

    if constraint is None:
        return
    try:
        frontend.compile_constraint(constraint)
    except ConstraintError as e:
        raise CLIError(str(e)) from None


def _prompt(engine, args, parts=(), text: str | None = None, constraint=None):
    from ninfer.config import OutputOptions

    if text is None:
        text = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not args.chat:
        return engine.frontend.prepare_text(text), OutputOptions(stop=tuple(args.stop), parse_reasoning=False,
                                                                 parse_tool_calls=False, constraint=constraint)
    content = [*parts, {"type": "text", "text": text}] if parts else text
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": content}]
    prompt = engine.frontend.prepare_chat(messages, chat_template_kwargs={"enable_thinking": args.think == "on"})
    return prompt, OutputOptions(stop=tuple(args.stop), parse_tool_calls=False, thinking_budget=args.thinking_budget,
                                 constraint=constraint)


def run(args: argparse.Namespace) -> int:
    from ninfer.config import GenerationDelta, GenerationError, GenerationResult

    max_tokens = check_max_tokens(args.max_tokens)
    if args.system and not args.chat:
        raise CLIError("--system needs --chat")
    if args.thinking_budget is not None and (args.thinking_budget < 0 or not args.chat or args.think != "on"):
        raise CLIError("--thinking-budget needs --chat with --think on and a value >= 0")
    if (args.image or args.video) and not args.chat:
        raise CLIError(f"--{'image' if args.image else 'video'} needs --chat (media go into a chat message)")
    if len(args.video) > 1:
        raise CLIError("--video may be given once")
    if args.think != "on" and not args.chat:
        raise CLIError("--think needs --chat (the chat template's thinking mode)")
    # NOTE: everything that can be refused without the model is refused before it loads.
    constraint = output_constraint(args)
    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not text and not (args.image or args.video):
        raise CLIError("the prompt is empty" + (" (stdin gave no text)" if args.prompt == "-" else "")
                       + ": pass the text to continue with -p TEXT")
    parts = media_parts(args.image, args.video)
    sampling_params(args)
    config = engine_config(args)
    path, _, _ = resolve_model(args.model, config=config)
    engine = open_engine(path, config)
    try:
        compile_constraint(engine.frontend, constraint)         # NOTE: a bad constraint fails before submit
        try:
            prompt, output = _prompt(engine, args, parts, text, constraint)
        except ValueError as e:
            raise CLIError(str(e)) from None
        limit = output_room(engine, prompt.num_prompt_tokens)
        if limit < 1:
            raise CLIError(f"the prompt has {prompt.num_prompt_tokens} tokens; max_model_len is {engine.max_model_len}"
                           f"{room_note(engine)}")
        t0 = time.monotonic()
        handle = engine.submit(prompt, sampling_params(args, engine.frontend.sampling_defaults), max_tokens=min(max_tokens, limit),
                               output=output)
        color = use_color(sys.stderr)
        ttft = None
        in_reasoning = False
        result = None
        try:
            for ev in handle:
                if isinstance(ev, GenerationDelta):
                    if ttft is None and ev.token_ids:
                        ttft = time.monotonic() - t0
                    if args.json:
                        continue
                    if ev.delta.reasoning:
                        sys.stderr.write(dim(ev.delta.reasoning, color))
                        sys.stderr.flush()
                        in_reasoning = True
                    if ev.delta.text:
                        if in_reasoning:
                            sys.stderr.write("\n")
                            in_reasoning = False
                        sys.stdout.write(ev.delta.text)
                        sys.stdout.flush()
                elif isinstance(ev, GenerationResult):
                    result = ev
                elif isinstance(ev, GenerationError):
                    raise CLIError(f"generation failed ({ev.kind.value}): {ev.message}", code=1)
        finally:
            handle.close()
        elapsed = time.monotonic() - t0
        if args.json:
            u = result.usage
            print(json.dumps({
                "text": result.text, "reasoning": result.reasoning,
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in result.tool_calls],
                "finish_reason": result.finish_reason.value, "token_ids": list(result.token_ids),
                "usage": {"prompt_tokens": u.num_prompt_tokens, "cached_tokens": u.num_reused_tokens,
                          "output_tokens": u.num_output_tokens, "reasoning_tokens": u.num_reasoning_tokens,
                          **({} if u.num_spec_rounds is None else {
                              "num_spec_rounds": u.num_spec_rounds,
                              "num_spec_accepted_tokens": u.num_spec_accepted_tokens,
                              "mean_acceptance_length": u.mean_acceptance_length})},
                "ttft_s": ttft, "elapsed_s": elapsed,
                **({"synthetic_weights": True} if result.extra.get("synthetic_weights") else {})}, ensure_ascii=False))
        else:
            if in_reasoning:
                sys.stderr.write("\n")
            sys.stdout.write("\n")
            sys.stdout.flush()
        print(usage_line(result, ttft, elapsed), file=sys.stderr)
        return 0
    finally:
        engine.close()
