"""What every registered target package provides (identity-neutral contract)."""
from __future__ import annotations

from dataclasses import dataclass

from ninfer.targets.qwen3_6.dims import Qwen36Dims


@dataclass(frozen=True, slots=True)
class StorageProfile:
    """How the package's weights are stored in a `.ninfer` artifact by default."""
    default_dtype: str          # "bf16" | "fp32"
    description: str


@dataclass(frozen=True, slots=True)
class TargetPackage:
    identity: str               # e.g. "qwen3_6-27b"
    family: str                 # e.g. "qwen3_6"
    dims: Qwen36Dims
    storage: StorageProfile
    module: str                 # the package module that owns binder, leaves and the Program instance
