"""Arrival counters of the kernels whose programs finish a shared result in the last one to arrive
(split-K GEMV, the GDN decode step's fused gated norm): one zeroed int32 buffer per device, shared by
those kernels. Each kernel touches it only after `_pdl.enter` (so never while another one runs) and
its last program of a group resets the group's counter to 0, so the buffer is all zeros between
launches and CUDA-graph replays need no reset."""
from __future__ import annotations

import torch
import triton

__all__ = ["arrival_counters"]

_COUNTERS: dict[torch.device, torch.Tensor] = {}


def arrival_counters(device: torch.device, n: int) -> torch.Tensor | None:
    """The device's zeroed counters (>= n of them); None when they would have to be allocated during a
    CUDA-graph capture (the caller then takes a path without counters)."""
    c = _COUNTERS.get(device)
    if c is not None and c.numel() >= n:
        return c
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    c = torch.zeros(max(1 << 16, triton.next_power_of_2(n)), dtype=torch.int32, device=device)
    _COUNTERS[device] = c
    return c
