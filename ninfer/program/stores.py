"""Physical backings created once at start: paged KV planes and StateImage planes.

    PagedKVStore (one shared pool per attention layer, page size fixed at start)
      k[layer], v[layer]   [num_pages, page_size, kv_heads, head_dim]   model dtype
      page p of every layer belongs to the same owner (one page id maps all layers)

    StateImageStore (fixed entries; entry e of every plane belongs to the same owner)
      plane[name][layer]   [num_entries, *shape]   plane dtype
      entries [0, num_slots)                 StateImage slots (owned via SlotPool)
      entries [num_slots, num_slots+scratch)  provisional area of the workspace (never a slot)

Only bookkeeping-free storage lives here; ownership is in PagePool / SlotPool.

On the CPU a large plane is a fresh anonymous mapping (`zeros`): the kernel hands it out zeroed and
commits a page of memory only when it is first written, so a pool sized for long sequences costs what
its used pages hold (pages are handed out lowest id first), not its full size at start.
"""
from __future__ import annotations

import math
import mmap

import torch

# NOTE: below this a plane is an ordinary zeroed tensor (a mapping's granularity is a memory page).
LAZY_BYTES = 1 << 20


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zeroed tensor; on the CPU, one of LAZY_BYTES or more is backed by an anonymous mapping
    (zero pages committed on first write; the tensor keeps the mapping alive)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if torch.device(device).type != "cpu" or nbytes < LAZY_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8).view(dtype).view(shape)


class PagedKVStore:
    def __init__(self, num_layers: int, num_pages: int, page_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (num_layers, num_pages, page_size, kv_heads, head_dim)
        self.k = zeros(shape, dtype, device)
        self.v = zeros(shape, dtype, device)
        self.page_size = page_size

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[i], self.v[i]

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


class StateImageStore:
    def __init__(self, num_layers: int, num_slots: int, num_scratch: int,
                 planes: dict[str, tuple], device: torch.device | str) -> None:
        """planes: name -> (shape, dtype) of one layer's image, or (shape, dtype, layers) for a plane with its
        own layer count (default num_layers); each plane is [layers, num_slots + num_scratch, *shape]."""
        self.num_slots = num_slots
        self.num_scratch = num_scratch
        self.planes = {name: zeros((spec[2] if len(spec) > 2 else num_layers, num_slots + num_scratch, *spec[0]),
                                   spec[1], device)
                       for name, spec in planes.items()}
        # NOTE: entry ids (slots, scratch entries) name an image through this map; `swap` relabels two
        #       images, so a commit moves a provisional image into a slot without copying it (27B: 150
        #       MB read + written per row and commit). Kernels take physical indices (`phys`).
        self._phys = list(range(num_slots + num_scratch))

    def scratch_entry(self, i: int) -> int:
        if not (0 <= i < self.num_scratch):
            raise IndexError(f"scratch entry {i} outside 0..{self.num_scratch - 1}")
        return self.num_slots + i

    def phys(self, e: int) -> int:
        """The planes' index of entry e's image (what kernels and tensors index with)."""
        return self._phys[e]

    def image(self, name: str, e: int) -> torch.Tensor:
        """Entry e's image in plane `name`: a view [layers, ...]."""
        return self.planes[name][:, self._phys[e]]

    def swap(self, a: int, b: int) -> None:
        """Exchange the images of entries a and b (no data moves). Work already queued keeps the
        physical images it was given; what is queued later sees the new names."""
        self._phys[a], self._phys[b] = self._phys[b], self._phys[a]

    def copy_entry(self, dst: int, src: int) -> None:
        """Copy one whole state image (every plane, every layer)."""
        d, s = self._phys[dst], self._phys[src]
        for t in self.planes.values():
            t[:, d].copy_(t[:, s])

    def zero_entry(self, e: int) -> None:
        self.zero_image(self._phys[e])

    def zero_image(self, p: int) -> None:
        """Zero physical image p (every plane, every layer)."""
        for t in self.planes.values():
            t[:, p].zero_()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.planes.values())
