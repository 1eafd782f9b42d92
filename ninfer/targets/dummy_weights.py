"""Synthetic weights (`--load-format dummy`): a real package identity with seeded random tensors
generated directly on the device, so the real sizes (27B, 35B-A3B) can be benchmarked without a
checkpoint. A benchmarking aid only: speed does not depend on the weight values, everything else
(output text, acceptance rates) is meaningless, and `synthetic` is True so callers mark it so.

`DummyWeights` offers the part of the `Artifact` interface a Program reads (`identity`,
`package`, `dims`, `tensor(name)`, `tensor_names()`, `has_group()`), so
`create_program(DummyWeights(identity, device=...), config)` works for every package. Each
tensor is drawn on demand from its own generator, seeded by (seed, crc32(name)): the same
identity and seed give the same weights on the same device, in any load order.

Values (chosen to keep the forward pass finite, not to be a trained model):
    matrices, embeddings        N(0, std), std = 0.02
    zero-centred RMSNorm (1+w)  N(0, std)
    GDN gated norm weight       1 (fp32, as stored in real checkpoints)
    A_log                       log U(1, 16) (fp32);  dt_bias 1;  conv1d U(-0.5, 0.5)
    biases (vision)             0
"""
from __future__ import annotations

import zlib

import torch

from ninfer.targets.qwen3_6.schema import FP32_KEEP_SUFFIXES, tensor_specs
from ninfer.targets.registry import lookup

__all__ = ["DummyWeights"]


class DummyWeights:
    synthetic = True

    def __init__(self, identity: str, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
                 seed: int = 0, std: float = 0.02) -> None:
        self.package = lookup(identity)
        self.identity = self.package.identity
        self.dims = self.package.dims
        self.device = torch.device(device)
        self.dtype = dtype
        self.seed = seed
        self.std = std
        self._specs = {s.name: s for s in tensor_specs(self.dims)}

    def tensor_names(self) -> list[str]:
        return list(self._specs)

    def has_group(self, group: str) -> bool:
        return any(s.group == group for s in self._specs.values())

    def _generator(self, name: str) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed((self.seed * 0x9E3779B1 + zlib.crc32(name.encode())) & 0x7FFF_FFFF_FFFF_FFFF)
        return g

    def tensor(self, name: str) -> torch.Tensor:
        """A fresh [shape] tensor on the device (fp32 for A_log and the GDN norm, else `dtype`)."""
        spec = self._specs.get(name)
        if spec is None:
            raise KeyError(f"{self.identity} has no canonical tensor {name!r}")
        shape, dev, gen = spec.shape, self.device, self._generator(name)
        fp32 = name.endswith(FP32_KEEP_SUFFIXES)
        dt = torch.float32 if fp32 else self.dtype
        if name.endswith("linear_attn.A_log"):
            return torch.empty(shape, dtype=dt, device=dev).uniform_(1.0, 16.0, generator=gen).log_()
        if name.endswith("linear_attn.norm.weight"):
            return torch.ones(shape, dtype=dt, device=dev)
        if name.endswith("dt_bias"):
            return torch.ones(shape, dtype=dt, device=dev)
        if name.endswith("conv1d.weight"):
            return torch.empty(shape, dtype=dt, device=dev).uniform_(-0.5, 0.5, generator=gen)
        if name.endswith(".bias"):
            return torch.zeros(shape, dtype=dt, device=dev)
        return torch.empty(shape, dtype=dt, device=dev).normal_(0.0, self.std, generator=gen)

    def close(self) -> None:
        pass
