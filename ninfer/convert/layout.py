"""Source checkpoint names -> canonical names (ninfer/targets/qwen3_6/schema.py).

Official multimodal layout: `model.language_model.X` -> `X`, `model.visual.X` -> `visual.X`,
`mtp.*` and `lm_head.weight` unchanged. Text-only layout: `model.X` -> `X`. Per-expert MoE
tensors `P.mlp.experts.{e}.{gate,up,down}_proj.weight` (main layers and MTP) become the fused
`P.mlp.experts.gate_up_proj [E, 2I, H]` (gate rows first) and `P.mlp.experts.down_proj [E, H, I]`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ninfer.convert.source import SourceTensor

_PER_EXPERT = re.compile(r"^(?P<prefix>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def canonical_name(src: str) -> str | None:
    for old, new in (("model.language_model.", ""), ("model.visual.", "visual."), ("model.", "")):
        if src.startswith(old):
            return new + src[len(old):]
    if src.startswith("mtp.") or src == "lm_head.weight":
        return src
    return None


@dataclass
class Recipe:
    """How one canonical tensor is assembled: a direct copy, or a stack of per-expert parts."""
    name: str
    direct: SourceTensor | None = None
    # per-expert: expert index -> {"gate_proj"|"up_proj"|"down_proj": SourceTensor}
    experts: dict[int, dict[str, SourceTensor]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)


def plan(tensors: dict[str, SourceTensor]) -> tuple[dict[str, Recipe], list[str]]:
    """Group source tensors into canonical recipes; returns (recipes, unmapped source names)."""
    recipes: dict[str, Recipe] = {}
    unmapped = []
    per_expert: dict[str, dict[int, dict[str, SourceTensor]]] = {}
    for src, t in tensors.items():
        canon = canonical_name(src)
        if canon is None:
            unmapped.append(src)
            continue
        m = _PER_EXPERT.match(canon)
        if m:
            per_expert.setdefault(m["prefix"], {}).setdefault(int(m["e"]), {})[m["proj"]] = t
            continue
        if canon in recipes:
            unmapped.append(src)  # two layouts name the same tensor (e.g. model.X and model.language_model.X)
            continue
        recipes[canon] = Recipe(canon, direct=t, sources=[src])
    for prefix, experts in per_expert.items():
        for fused, projs in ((f"{prefix}.gate_up_proj", ("gate_proj", "up_proj")), (f"{prefix}.down_proj", ("down_proj",))):
            parts = {e: {p: d[p] for p in projs if p in d} for e, d in experts.items()}
            if fused in recipes:
                unmapped += [t.name for d in parts.values() for t in d.values()]
                continue
            recipes[fused] = Recipe(fused, experts=parts, sources=[t.name for d in parts.values() for t in d.values()])
    return recipes, sorted(unmapped)
