"""The closed registry: a literal mapping identity -> target package. No plug-in discovery."""
from __future__ import annotations

from ninfer.targets import qwen3_6_27b, qwen3_6_35b_a3b, qwen3_6_tiny_dense, qwen3_6_tiny_moe
from ninfer.targets.package import TargetPackage

REGISTRY: dict[str, TargetPackage] = {
    qwen3_6_27b.IDENTITY: qwen3_6_27b.PACKAGE,
    qwen3_6_35b_a3b.IDENTITY: qwen3_6_35b_a3b.PACKAGE,
    qwen3_6_tiny_dense.IDENTITY: qwen3_6_tiny_dense.PACKAGE,
    qwen3_6_tiny_moe.IDENTITY: qwen3_6_tiny_moe.PACKAGE,
}


class UnknownIdentityError(ValueError):
    pass


def lookup(identity: str) -> TargetPackage:
    try:
        return REGISTRY[identity]
    except KeyError:
        raise UnknownIdentityError(
            f"unknown model identity {identity!r}; known identities: {', '.join(sorted(REGISTRY))}") from None
