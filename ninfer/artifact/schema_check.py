"""What a `.ninfer` of a given package must contain: the tensor set, shapes and storage dtypes.

Shared by the writer (reject before anything is renamed into place) and the reader (reject a
descriptor whose table disagrees with the registered package).
"""
from __future__ import annotations

from ninfer.targets.package import TargetPackage
from ninfer.targets.qwen3_6.schema import FP32_KEEP_SUFFIXES, OPTIONAL_GROUPS, REQUIRED_GROUPS, TensorSpec, tensor_specs


def all_specs(package: TargetPackage) -> dict[str, TensorSpec]:
    return {s.name: s for s in tensor_specs(package.dims)}


def expected_specs(package: TargetPackage, groups: tuple[str, ...]) -> dict[str, TensorSpec]:
    return {s.name: s for s in tensor_specs(package.dims, groups)}


def storage_dtype(name: str, source_dtype: str, dtype: str) -> str:
    """The dtype a tensor is stored in: `dtype`, except fp32 norm/A_log tensors, which stay fp32."""
    if source_dtype == "fp32" and name.endswith(FP32_KEEP_SUFFIXES):
        return "fp32"
    return dtype


def dtype_allowed(name: str, stored: str, dtype: str) -> bool:
    return stored == dtype or (stored == "fp32" and name.endswith(FP32_KEEP_SUFFIXES))


def _listing(names, limit: int = 12) -> str:
    names = sorted(names)
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def table_problems(package: TargetPackage, present: dict[str, tuple[tuple[int, ...], str]],
                   dtype: str, groups: tuple[str, ...] | None = None) -> list[str]:
    """Problems of a tensor table {name: (shape, stored dtype)} against the package schema.

    `groups` are the declared groups; None means: required groups plus every optional group of
    which at least one tensor is present (an optional group is all or nothing).
    """
    known = all_specs(package)
    problems = []
    unexpected = [n for n in present if n not in known]
    if groups is None:
        seen = {known[n].group for n in present if n in known}
        groups = REQUIRED_GROUPS + tuple(g for g in OPTIONAL_GROUPS if g in seen)
    missing_groups = [g for g in REQUIRED_GROUPS if g not in groups]
    if missing_groups:
        problems.append(f"required groups not declared: {', '.join(missing_groups)}")
    exp = expected_specs(package, groups)
    unexpected += [n for n in present if n in known and n not in exp]
    missing = [n for n in exp if n not in present]
    if missing:
        problems.append(f"{len(missing)} missing tensor(s): {_listing(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensor(s): {_listing(unexpected)}")
    bad_shape = [f"{n} {list(shape)} (expected {list(exp[n].shape)})"
                 for n, (shape, _) in present.items() if n in exp and tuple(shape) != exp[n].shape]
    if bad_shape:
        problems.append(f"{len(bad_shape)} wrong shape(s): {_listing(bad_shape)}")
    bad_dtype = [f"{n} {dt}" for n, (_, dt) in present.items() if n in exp and not dtype_allowed(n, dt, dtype)]
    if bad_dtype:
        problems.append(f"{len(bad_dtype)} tensor(s) not stored as {dtype}: {_listing(bad_dtype)}")
    return problems
