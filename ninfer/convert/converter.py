"""`ninfer convert`: a Hugging Face Qwen3.6 checkpoint directory -> one verified `.ninfer` file.

Everything is checked before the first payload byte is written (config facts against the
registry, the full tensor inventory and shapes, the frontend files); then tensors stream one at a
time in bounded pieces (CHUNK_BYTES of source per read; per-expert MoE tensors are stacked one
expert at a time), so peak memory does not grow with the model. Source files are hashed for the
provenance record in a background thread while the payloads are written.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
from pathlib import Path
from typing import Iterator, Mapping

import torch

from ninfer.artifact import ArtifactError, ChunkedTensor, write_artifact
from ninfer.artifact.format import STORAGE_DTYPES
from ninfer.artifact.schema_check import storage_dtype, table_problems
from ninfer.convert.identify import config_facts, match_identity
from ninfer.convert.layout import Recipe, plan
from ninfer.convert.source import ST_DTYPES, CheckpointSource, ConvertError
from ninfer.targets.package import TargetPackage
from ninfer.targets.qwen3_6.schema import OPTIONAL_GROUPS, REQUIRED_GROUPS
from ninfer.targets.registry import REGISTRY

_ST_NAMES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}
_MTP_LAYER = re.compile(r"^mtp\.layers\.(\d+)\.")


def _group_of(name: str) -> str | None:
    return "mtp" if name.startswith("mtp.") else "vision" if name.startswith("visual.") else None


def _load_json(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{what} not found: {path}") from None
    except ValueError as e:
        raise ConvertError(f"{path.name} is not valid JSON: {e}") from None


# The image / video processor settings (optional; checked here, stored verbatim). An artifact
# without them preprocesses with the Qwen3.6 family values (vision_preprocess.py).
PREPROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json")


def frontend_resources(src: Path) -> dict[str, bytes]:
    """tokenizer.json, tokenizer_config.json, a chat template (file or tokenizer_config field), and
    generation_config.json, preprocessor_config.json and video_preprocessor_config.json (optional)
    as raw bytes."""
    out = {}
    for name in ("tokenizer.json", "tokenizer_config.json"):
        p = src / name
        if not p.is_file():
            raise ConvertError(f"{name} not found in {src} (the tokenizer files are part of the artifact)")
        out[name] = p.read_bytes()
    tpl = src / "chat_template.jinja"
    if tpl.is_file():
        out["chat_template.jinja"] = tpl.read_bytes()
    else:
        try:
            inline = json.loads(out["tokenizer_config.json"]).get("chat_template")
        except ValueError as e:
            raise ConvertError(f"tokenizer_config.json is not valid JSON: {e}") from None
        if not isinstance(inline, str) or not inline:
            raise ConvertError(f"no chat template in {src}: neither chat_template.jinja nor a "
                               "chat_template string in tokenizer_config.json")
        out["chat_template.jinja"] = inline.encode()
    for name in ("generation_config.json", *PREPROCESSOR_FILES):
        p = src / name
        if p.is_file():
            out[name] = p.read_bytes()
    if any(name in out for name in PREPROCESSOR_FILES):
        from ninfer.targets.qwen3_6.frontend.vision_preprocess import VisionPreprocessConfig
        try:
            VisionPreprocessConfig.from_resources(out)
        except ValueError as e:
            raise ConvertError(f"vision preprocessing config in {src}: {e}") from None
    return out


def _check_recipe(r: Recipe, package: TargetPackage) -> tuple[tuple[int, ...] | None, str | None, list[str]]:
    """(assembled shape, source dtype, problems) of one canonical tensor."""
    if r.direct is not None:
        return r.direct.shape, r.direct.dtype, []
    d = package.dims
    E, I, H = d.num_experts, d.moe_intermediate_size, d.hidden_size
    fused_gate_up = r.name.endswith("gate_up_proj")
    projs = ("gate_proj", "up_proj") if fused_gate_up else ("down_proj",)
    want = (I, H) if fused_gate_up else (H, I)
    prefix = r.name.rsplit(".", 1)[0]
    problems, dtypes = [], set()
    extra = sorted(e for e in r.experts if e >= E)
    if extra:
        problems.append(f"{prefix}: experts {extra} beyond num_experts={E}")
    for e in range(E):
        for p in projs:
            t = r.experts.get(e, {}).get(p)
            if t is None:
                problems.append(f"missing {prefix}.{e}.{p}.weight")
            elif t.shape != want:
                problems.append(f"{prefix}.{e}.{p}.weight has shape {list(t.shape)} (expected {list(want)})")
            else:
                dtypes.add(t.dtype)
    if len(dtypes) > 1:
        problems.append(f"{prefix}: per-expert tensors mix dtypes {sorted(dtypes)}")
    shape = (E, 2 * I, H) if fused_gate_up else (E, H, I)
    return (None if problems else shape), (dtypes.pop() if len(dtypes) == 1 else None), problems


def _produce(src: CheckpointSource, r: Recipe, shape, st_dtype: str) -> ChunkedTensor:
    if r.direct is not None:
        t = r.direct
        return ChunkedTensor(shape, ST_DTYPES[st_dtype], lambda: src.chunks(t))

    def experts() -> Iterator[torch.Tensor]:
        for e in range(shape[0]):
            parts = r.experts[e]
            if "gate_proj" in parts:
                yield torch.cat([src.read(parts["gate_proj"]), src.read(parts["up_proj"])])
            else:
                yield src.read(parts["down_proj"])
    return ChunkedTensor(shape, ST_DTYPES[st_dtype], experts)


class _Hasher(threading.Thread):
    """sha256 and size of each source file, computed beside the payload writing."""

    def __init__(self, src: Path, names: list[str]):
        super().__init__(daemon=True)
        self.src, self.names, self.result, self.error = src, names, [], None

    def run(self) -> None:
        try:
            for name in self.names:
                h, size = hashlib.sha256(), 0
                with open(self.src / name, "rb") as f:
                    while block := f.read(8 << 20):
                        h.update(block)
                        size += len(block)
                self.result.append({"name": name, "size": size, "sha256": h.hexdigest()})
        except OSError as e:
            self.error = e


def convert(src_dir: str | Path, out_path: str | Path, *, target: str | None = None, dtype: str | None = None,
            progress: bool = False, candidates: Mapping[str, TargetPackage] | None = None) -> Path:
    """Convert `src_dir` into `out_path`; returns the output path. Raises ConvertError (checkpoint
    problems) or ArtifactError (writing problems); a failed conversion leaves no output file.

    candidates: the identities to match against (default: the closed registry). Benchmarks pass
    an unregistered package here to measure conversion of sizes the registry does not hold.
    """
    src = Path(src_dir)
    if not src.is_dir():
        raise ConvertError(f"{src} is not a directory")
    if dtype is not None and dtype not in STORAGE_DTYPES:
        raise ConvertError(f"unsupported --dtype {dtype!r}; choose one of {', '.join(STORAGE_DTYPES)}")
    candidates = REGISTRY if candidates is None else candidates
    config = _load_json(src / "config.json", "config.json")
    facts = config_facts(config)
    source = CheckpointSource(src)
    try:
        recipes, unmapped = plan(source.tensors)
        mtp_layers = {int(m[1]) for n in recipes if (m := _MTP_LAYER.match(n))}
        if mtp_layers:
            inferred = max(mtp_layers) + 1
            stated = facts.get("mtp_num_hidden_layers")
            if stated is not None and stated != inferred:
                raise ConvertError(f"config.json says mtp_num_hidden_layers={stated} but the checkpoint has "
                                   f"{inferred} mtp.layers.* layer(s)")
            facts["mtp_num_hidden_layers"] = inferred
        package = match_identity(facts, candidates, target)
        dtype = dtype or package.storage.default_dtype
        groups = REQUIRED_GROUPS + tuple(g for g in OPTIONAL_GROUPS if any(_group_of(n) == g for n in recipes))
        present, problems, shapes, st_dtypes = {}, [], {}, {}
        for name, r in recipes.items():
            shape, st, probs = _check_recipe(r, package)
            problems += probs
            if shape is not None and st is not None:
                shapes[name], st_dtypes[name] = shape, st
                present[name] = (shape, storage_dtype(name, _ST_NAMES[st], dtype))
            elif not probs:
                present[name] = ((), dtype)
        problems = table_problems(package, present, dtype, groups) + problems
        if unmapped:
            problems.append(f"{len(unmapped)} source tensor(s) with unknown names: {', '.join(unmapped[:12])}"
                            + (f" (+{len(unmapped) - 12} more)" if len(unmapped) > 12 else ""))
        if problems:
            raise ConvertError(f"checkpoint {src} cannot be converted to {package.identity}: " + "; ".join(problems))
        resources = frontend_resources(src)
        gen = json.loads(resources.get("generation_config.json", b"{}") or b"{}")
        eos = gen.get("eos_token_id", config.get("text_config", config).get("eos_token_id"))
        eos_ids = tuple([eos] if isinstance(eos, int) else (eos or []))

        from ninfer.targets.qwen3_6.schema import tensor_specs
        order = [s.name for s in tensor_specs(package.dims, groups)]
        total = sum(_nbytes(shapes[n], present[n][1]) for n in order)
        files = sorted(["config.json", *source.files, *[p.name for p in src.iterdir() if p.name in (
            "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
            "generation_config.json", *PREPROCESSOR_FILES)]])
        hasher = _Hasher(src, files)
        hasher.start()

        def provenance() -> dict:
            hasher.join()
            if hasher.error is not None:
                raise ArtifactError(f"reading source files for provenance failed: {hasher.error}")
            return {"files": hasher.result, "model_type": config.get("model_type"),
                    "layout": "multimodal" if any(n.startswith("model.language_model.") for n in source.tensors)
                    else "text",
                    "expert_layout": sorted({"per-expert" if r.direct is None else "fused"
                                             for n, r in recipes.items() if ".mlp.experts." in n}),
                    "source_dtypes": sorted(set(st_dtypes.values())), "converter": "ninfer convert"}

        from tqdm import tqdm
        with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                  disable=not progress, desc=f"convert {package.identity}") as bar:
            return write_artifact(
                out_path, package, ((n, _produce(source, recipes[n], shapes[n], st_dtypes[n])) for n in order),
                resources, dtype=dtype, groups=groups, eos_token_ids=eos_ids, source=provenance,
                on_tensor=lambda _name, nbytes: bar.update(nbytes))
    finally:
        source.close()


def _nbytes(shape, dtype: str) -> int:
    n = 4 if dtype == "fp32" else 2
    for s in shape:
        n *= s
    return n
