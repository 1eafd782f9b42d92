"""`ninfer inspect FILE [--verify]`: identity, dimensions, tensors and bytes by group, resources.
Given a Hugging Face checkpoint directory: the identity it matches (or why none) and whether the
user cache holds its conversion, without converting it."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

# Display groups: the schema's groups, with the FFN/experts split out of the decoder norms.
_ORDER = ("embedding", "gdn", "attention", "ffn", "experts", "norms", "vision", "mtp", "head")


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help=".ninfer artifact, or a Hugging Face checkpoint directory")
    p.add_argument("--verify", action="store_true", help="check every payload checksum")


def _display_group(info: dict) -> str:
    g, name = info["group"], info["name"]
    if g == "ffn":
        if ".mlp.experts." in name:
            return "experts"
        if ".mlp." not in name:
            return "norms"
    return g


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def describe(art) -> list[str]:
    d = art.dims
    lines = [f"file:        {art.path}",
             f"identity:    {art.identity} (family {art.package.family})",
             f"storage:     {art.dtype} (alignment {art.descriptor['storage']['alignment']} B, "
             f"checksums {art.descriptor['storage']['checksum']})",
             f"groups:      {', '.join(art.groups)}"]
    ffn = (f"MoE {d.num_experts} experts top-{d.num_experts_per_tok}, expert {d.moe_intermediate_size}, "
           f"shared {d.shared_expert_intermediate_size}" if d.is_moe else f"dense FFN {d.intermediate_size}")
    lines += [f"dims:        vocab {d.vocab_size}, hidden {d.hidden_size}, layers {d.num_hidden_layers} "
              f"({len(d.gdn_layers)} GDN + {len(d.attention_layers)} attention), {ffn}",
              f"             attention {d.num_attention_heads}q/{d.num_key_value_heads}kv x {d.head_dim}, "
              f"GDN {d.linear_num_key_heads}k/{d.linear_num_value_heads}v x {d.linear_key_head_dim}, "
              f"MTP layers {d.mtp_num_hidden_layers} ({'stored' if art.has_group('mtp') else 'not stored'}), "
              f"vision tower depth {d.vision.depth if d.vision else 0} "
              f"({'stored' if art.has_group('vision') else 'not stored'})"]
    by_group: dict[str, list[int]] = {}
    for name in art.tensor_names():
        info = art.tensor_info(name)
        acc = by_group.setdefault(_display_group(info), [0, 0])
        acc[0] += 1
        acc[1] += info["nbytes"]
    total = sum(v[1] for v in by_group.values())
    lines.append(f"tensors:     {len(art.tensor_names())}, {_fmt(total)}")
    for g in _ORDER:
        if g in by_group:
            lines.append(f"  {g:<11}{by_group[g][0]:>6} tensors {_fmt(by_group[g][1]):>12}")
    res = art.descriptor["resources"]
    lines.append("resources:   " + ", ".join(f"{r['name']} ({_fmt(r['nbytes'])})" for r in res))
    lines.append(f"eos ids:     {list(art.eos_token_ids)}")
    src = art.descriptor.get("source") or {}
    if src.get("files"):
        lines.append(f"source:      {len(src['files'])} files, {_fmt(sum(f['size'] for f in src['files']))}, "
                     f"layout {src.get('layout')}, dtypes {', '.join(src.get('source_dtypes', []))}")
    return lines


def describe_checkpoint(src: Path) -> list[str]:
    """A checkpoint directory: its size, the identity it matches and its conversion in the cache."""
    import json

    from ninfer.convert.cache import cached_path
    from ninfer.convert.identify import config_facts, match_identity
    from ninfer.convert.source import CheckpointSource, ConvertError
    from ninfer.targets.registry import REGISTRY

    if not (src / "config.json").is_file():
        raise ConvertError("not a Hugging Face checkpoint directory (no config.json)")
    source = CheckpointSource(src)
    try:
        shards, nbytes = source.files, sum(t.nbytes for t in source.tensors.values())
    finally:
        source.close()
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    lines = [f"checkpoint:  {src} (Hugging Face; {len(shards)} shard(s), {_fmt(nbytes)} of tensors, "
             f"model_type {config.get('model_type')})"]
    try:
        lines.append(f"identity:    {match_identity(config_facts(config), REGISTRY).identity}")
    except ConvertError as e:
        lines.append(f"identity:    none: {e}")
        return lines
    cached = cached_path(src)
    lines.append(f"converted:   {cached}" if cached.is_file() else
                 "converted:   not yet (`ninfer serve|generate|chat|score DIR` converts it once into the cache; "
                 "`ninfer convert DIR OUT.ninfer` writes a file of your choice)")
    return lines


def run(args: argparse.Namespace) -> int:
    from ninfer.artifact import ArtifactError, open_artifact
    from ninfer.gateway.cli.main import CLIError

    if Path(args.file).is_dir():
        from ninfer.convert import ConvertError
        if args.verify:
            raise CLIError(f"--verify checks a .ninfer file; {args.file} is a checkpoint directory")
        try:
            lines = describe_checkpoint(Path(args.file))
        except (ConvertError, OSError, ValueError) as e:
            raise CLIError(f"{args.file}: {e}") from None
        print("\n".join(lines))
        return 0
    try:
        t0 = time.perf_counter()
        with open_artifact(args.file, verify=args.verify) as art:
            for line in describe(art):
                print(line)
            if args.verify:
                print(f"verify:      all {len(art.tensor_names())} tensor and "
                      f"{len(art.descriptor['resources'])} resource checksums OK "
                      f"({time.perf_counter() - t0:.2f} s)")
    except ArtifactError as e:
        raise CLIError(str(e)) from None
    return 0
