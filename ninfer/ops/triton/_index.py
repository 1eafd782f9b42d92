"""Index tensors for the fast kernels: used as given when they are already integer tensors on the
kernel's device (the kernels load int32 or int64 alike), converted otherwise.

NOTE: a `.to(torch.int32)` per op and layer was ~200 extra copy kernels in one 27B decode step."""
from __future__ import annotations

import torch


def device_index(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if t.device == device and t.dtype in (torch.int32, torch.int64):
        return t
    return t.to(device=device, dtype=torch.int64)
