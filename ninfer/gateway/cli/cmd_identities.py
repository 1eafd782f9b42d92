"""`ninfer identities [--json]`: the registered model identities and their key dimensions.

An identity is the exact set of dimension facts a checkpoint must have to be converted (ninfer
convert matches config.json against them field by field); `convert --list` prints the same table.
"""
from __future__ import annotations

import argparse
import json

_COLUMNS = ("IDENTITY", "PARAMS", "LAYERS", "HIDDEN", "ATTENTION", "FFN", "VOCAB", "CONTEXT", "MTP", "VISION",
            "STORAGE")


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object per identity instead of a table")


def _params(package) -> dict[str, int]:
    """Parameter counts by part: the language model (text), the MTP layers, the vision tower."""
    from ninfer.targets.qwen3_6.schema import REQUIRED_GROUPS, tensor_specs

    out = {"text": 0, "mtp": 0, "vision": 0}
    groups = REQUIRED_GROUPS + ("mtp",) + (("vision",) if package.dims.vision is not None else ())
    for spec in tensor_specs(package.dims, groups):
        n = 1
        for s in spec.shape:
            n *= s
        out[spec.group if spec.group in out else "text"] += n
    return out


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def describe(package) -> dict:
    """The key dimensions of one identity, as a JSON-ready dict."""
    d = package.dims
    params = _params(package)
    return {
        "identity": package.identity, "family": package.family,
        "params": params["text"] + params["mtp"] + params["vision"], "params_text": params["text"],
        "num_hidden_layers": d.num_hidden_layers, "num_gdn_layers": len(d.gdn_layers),
        "num_attention_layers": len(d.attention_layers), "hidden_size": d.hidden_size,
        "num_attention_heads": d.num_attention_heads, "num_key_value_heads": d.num_key_value_heads,
        "head_dim": d.head_dim, "ffn": "moe" if d.is_moe else "dense",
        "intermediate_size": d.intermediate_size, "num_experts": d.num_experts,
        "num_experts_per_tok": d.num_experts_per_tok, "moe_intermediate_size": d.moe_intermediate_size,
        "shared_expert_intermediate_size": d.shared_expert_intermediate_size, "vocab_size": d.vocab_size,
        "max_position_embeddings": d.max_position_embeddings, "mtp_num_hidden_layers": d.mtp_num_hidden_layers,
        "vision_depth": d.vision.depth if d.vision is not None else 0,
        "storage_dtype": package.storage.default_dtype,
    }


def _row(info: dict) -> tuple[str, ...]:
    ffn = (f"MoE {info['num_experts']}x{info['moe_intermediate_size']} top-{info['num_experts_per_tok']} "
           f"+shared {info['shared_expert_intermediate_size']}" if info["ffn"] == "moe"
           else f"dense {info['intermediate_size']}")
    return (info["identity"], _count(info["params"]),
            f"{info['num_hidden_layers']} ({info['num_gdn_layers']} GDN + {info['num_attention_layers']} attn)",
            str(info["hidden_size"]),
            f"{info['num_attention_heads']}q/{info['num_key_value_heads']}kv x {info['head_dim']}", ffn,
            str(info["vocab_size"]), str(info["max_position_embeddings"]), str(info["mtp_num_hidden_layers"]),
            f"{info['vision_depth']} blocks" if info["vision_depth"] else "-", info["storage_dtype"])


def table() -> list[str]:
    """The identities table, one line per identity under a header line."""
    from ninfer.targets.registry import REGISTRY

    rows = [_COLUMNS] + [_row(describe(REGISTRY[ident])) for ident in sorted(REGISTRY)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def run(args: argparse.Namespace) -> int:
    from ninfer.targets.registry import REGISTRY

    if args.json:
        for ident in sorted(REGISTRY):
            print(json.dumps(describe(REGISTRY[ident])))
        return 0
    for line in table():
        print(line)
    print("PARAMS: all stored weights (language model, MTP layers, vision tower); CONTEXT: native positions. "
          "A checkpoint converts when its config.json matches one identity field by field.")
    return 0
