"""The Qwen3.6 vision tower (transformers' `Qwen3_5VisionModel`): image and video patches to the
embeddings that take the place of their `<|image_pad|>` / `<|video_pad|>` tokens in the language model.

Inputs (the Frontend's preprocessing; transformers' `Qwen2VLImageProcessor` / `Qwen3VLVideoProcessor`):
    pixel_values [N, C_in*T*P*P]  one row per patch, values in (c, t, py, px) order; the patches of one
                                  media entry are consecutive, frame after frame, and inside a frame in
                                  merge-block-major order (m x m blocks row-major, the patches of a block
                                  row-major), so m*m consecutive rows are one block
    grid_thw                      one (t, h, w) per media entry, in pixel_values' order: an image has t = 1,
                                  a video t = frames / T; h and w are patch counts (multiples of m)
Output [N / m^2, out_hidden_size] (model dtype): entry after entry, t*h*w/m^2 rows each, in the order of the
entry's placeholder tokens.

Forward (27B / 35B-A3B: C = 1152, 16 heads of 72, m = 2, a 48 x 48 position table):
    x  = pixel_values @ Wp^T + bp               the Conv3d of kernel = stride = (T, P, P) as one GEMM
    x += pos(h, w)                              the learned S x S table resampled to h x w (bilinear,
                                                align_corners), in the patch order, the same for every frame
    cos, sin = rotary(row, col)                 fp32; head_dim D: D/4 frequencies theta^(-2i/(D/2)); the
                                                angles [row * f | col * f] twice over D (rotate_half form)
    depth x:  x += proj(attn(LN1(x)))           qkv rows [q | k | v], heads of D; rotary on q and k in fp32;
                                                softmax(q k^T / sqrt(D)) v, non-causal, within one frame
              x += fc2(gelu_tanh(fc1(LN2(x))))
    y  = LN(x).view(N / m^2, m^2 C)             the merger: norm before the m x m merge
    y  = fc2(gelu(fc1(y)))                      exact-erf GELU here (tanh GELU in the blocks)
LayerNorms have eps 1e-6. Attention segments are frames, as transformers' `cu_seqlens`: an image is one
segment of h*w patches, a video t segments of h*w (a frame's patches never see another frame's).

The tower returns only the merged embeddings: Qwen3.5's `model.visual(...)` has no deepstack outputs (its
`last_hidden_state` is the pre-merger x, which the language model does not read). `Qwen3_5Model` splits the
merged rows per entry, casts them to the LM dtype and `masked_scatter`s them, in order, over the image
(then video) placeholder positions of `inputs_embeds`; nothing is added to later LM layers.

Two attention forms, equal up to rounding: `reference` (plain fp32 softmax per frame, a [heads, L, L] score
matrix: the CPU and test path) and `sdpa` (torch's scaled_dot_product_attention over the frames of one
entry as one batch; on CUDA the flash / memory-efficient kernels, no [L, L] matrix in memory). The tower
picks `sdpa` on CUDA, `reference` elsewhere, unless told. With `sdpa` on CUDA (Triton importable) the rotary
runs as one kernel in place on the qkv rows (`ninfer.ops.triton.vision_rope`); otherwise, and always in the
reference form, as the fp32 PyTorch form (`_rotate`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ninfer.ops.opset import fast_available
from ninfer.targets.qwen3_6.dims import Qwen36Dims, VisionDims
from ninfer.targets.qwen3_6.patch_rows import PatchRows
from ninfer.targets.qwen3_6.program.model_view import tensor_getter
from ninfer.targets.qwen3_6.schema import FP32_KEEP_SUFFIXES, tensor_specs

__all__ = ["VisionBlockWeights", "VisionView", "VisionTower", "load_vision_view", "parse_grids",
           "vision_output_rows", "ROPE_THETA", "LN_EPS"]

# NOTE: not in the checkpoint's vision_config; transformers' default for the axial vision rotary.
ROPE_THETA = 10000.0
LN_EPS = 1e-6
# The order in which the `sdpa` form asks torch for its attention kernels (names of
# torch.nn.attention.SDPBackend; a kernel that cannot take the inputs is passed over for the next);
# None leaves the choice to torch. `bench/vision_encode.py --sdpa-backends` times each one.
SDPA_BACKENDS: tuple[str, ...] | None = None
# On CUDA, the blocks' fc1 + bias + tanh GELU as one cuBLASLt GEMM with its GELU epilogue.
GELU_EPILOGUE = False


def _sdpa_backends(names: Sequence[str] | None) -> list[SDPBackend] | None:
    if names is None:
        return None
    out = []
    for name in names:
        member = getattr(SDPBackend, name.upper(), None)
        if member is None or name.upper() in ("ERROR", "OVERRIDEABLE"):
            raise ValueError(f"unknown SDPA backend {name!r}: one of flash_attention, cudnn_attention, "
                             f"efficient_attention, math")
        out.append(member)
    if not out:
        raise ValueError("sdpa_backends is empty: name at least one backend, or None for torch's choice")
    return out


@dataclass(frozen=True)
class VisionBlockWeights:
    norm1_weight: torch.Tensor      # [C]
    norm1_bias: torch.Tensor        # [C]
    qkv_weight: torch.Tensor        # [3C, C]  rows [q | k | v], each heads x D
    qkv_bias: torch.Tensor          # [3C]
    proj_weight: torch.Tensor       # [C, C]
    proj_bias: torch.Tensor         # [C]
    norm2_weight: torch.Tensor      # [C]
    norm2_bias: torch.Tensor        # [C]
    fc1_weight: torch.Tensor        # [I, C]
    fc1_bias: torch.Tensor          # [I]
    fc2_weight: torch.Tensor        # [C, I]
    fc2_bias: torch.Tensor          # [C]


@dataclass(frozen=True)
class VisionView:
    dims: VisionDims
    patch_weight: torch.Tensor      # [C, C_in*T*P*P]  the Conv3d kernel [C, C_in, T, P, P] flattened (a view)
    patch_bias: torch.Tensor        # [C]
    pos_embed: torch.Tensor         # [S*S, C]  learned S x S grid, row-major
    blocks: tuple[VisionBlockWeights, ...]
    merger_norm_weight: torch.Tensor  # [C]
    merger_norm_bias: torch.Tensor    # [C]
    merger_fc1_weight: torch.Tensor   # [m^2 C, m^2 C]
    merger_fc1_bias: torch.Tensor     # [m^2 C]
    merger_fc2_weight: torch.Tensor   # [out_hidden_size, m^2 C]
    merger_fc2_bias: torch.Tensor     # [out_hidden_size]


def load_vision_view(dims: Qwen36Dims, weights: Any, device: torch.device | str, dtype: torch.dtype) -> VisionView:
    """Copy the vision tower's tensors (schema group "vision", canonical names `visual.*`) to `device` /
    `dtype`. A tensor the source keeps fp32 under the schema's FP32_KEEP_SUFFIXES would stay fp32; no vision
    tensor is among them (the checkpoints store the tower in the model dtype), so the view is all `dtype`."""
    if dims.vision is None:
        raise ValueError("this model identity has no vision tower (its dims carry no vision facts)")
    has_group = getattr(weights, "has_group", None)
    if callable(has_group) and not has_group("vision"):
        raise ValueError("the weights store no vision tower (group 'vision'); reconvert the checkpoint "
                         "with its model.visual.* tensors")
    get = tensor_getter(weights)
    t: dict[str, torch.Tensor] = {}
    for spec in tensor_specs(dims, ("vision",)):
        src = get(spec.name)
        if tuple(src.shape) != spec.shape:
            raise ValueError(f"tensor {spec.name} has shape {tuple(src.shape)}, schema says {spec.shape}")
        keep = src.dtype == torch.float32 and spec.name.endswith(FP32_KEEP_SUFFIXES)
        t[spec.name[len("visual."):]] = src.to(device=device, dtype=torch.float32 if keep else dtype).contiguous()
    blocks = []
    for b in range(dims.vision.depth):
        p = f"blocks.{b}."
        blocks.append(VisionBlockWeights(
            t[p + "norm1.weight"], t[p + "norm1.bias"], t[p + "attn.qkv.weight"], t[p + "attn.qkv.bias"],
            t[p + "attn.proj.weight"], t[p + "attn.proj.bias"], t[p + "norm2.weight"], t[p + "norm2.bias"],
            t[p + "mlp.linear_fc1.weight"], t[p + "mlp.linear_fc1.bias"],
            t[p + "mlp.linear_fc2.weight"], t[p + "mlp.linear_fc2.bias"]))
    pw = t["patch_embed.proj.weight"]
    return VisionView(dims.vision, pw.view(pw.shape[0], -1), t["patch_embed.proj.bias"], t["pos_embed.weight"],
                      tuple(blocks), t["merger.norm.weight"], t["merger.norm.bias"],
                      t["merger.linear_fc1.weight"], t["merger.linear_fc1.bias"],
                      t["merger.linear_fc2.weight"], t["merger.linear_fc2.bias"])


# rows looked up per launch: bounds the int32 indices and the gathered block of a long video to tens of MB
_LOOKUP_ROWS = 16384


def patch_rows_tensor(rows: PatchRows, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """The tower's input [N, C*T*P*P] in `dtype` on `device` from uint8 patch values and their lookup table
    (patch_rows.py): the values cross to the device (a quarter of the float32 rows' bytes, an eighth for an
    image) and the lookup runs there. Equal to rows.float32() cast to dtype, bit for bit: a table cast to
    dtype holds the casts of the values it is looked up for."""
    n, c, t, pp = rows.values.shape
    values = torch.from_numpy(np.ascontiguousarray(rows.values)).to(device)
    table = torch.from_numpy(rows.table).to(device).to(dtype)
    out = torch.empty(n, c, t * rows.repeat, pp, dtype=dtype, device=device)
    for ch in range(c):
        for r0 in range(0, n, _LOOKUP_ROWS):
            r1 = min(n, r0 + _LOOKUP_ROWS)
            got = torch.index_select(table[ch], 0, values[r0:r1, ch].reshape(-1).int()).view(r1 - r0, t, pp)
            for k in range(rows.repeat):
                out[r0:r1, ch, k * t:(k + 1) * t] = got
    return out.view(n, c * t * rows.repeat * pp)


def parse_grids(grid_thw: Iterable, merge: int) -> tuple[tuple[int, int, int], ...]:
    """grid_thw as a tuple of (t, h, w) ints (a [n, 3] tensor or rows of 3), checked: positive, h and w
    multiples of the merge size."""
    if isinstance(grid_thw, torch.Tensor):
        grid_thw = grid_thw.tolist()
    out = []
    for i, g in enumerate(grid_thw):
        row = tuple(int(v) for v in g)
        if len(row) != 3:
            raise ValueError(f"grid_thw[{i}] must be (t, h, w), got {tuple(g)}")
        t, h, w = row
        if min(row) < 1:
            raise ValueError(f"grid_thw[{i}] = {row}: t, h and w must be positive")
        if h % merge or w % merge:
            raise ValueError(f"grid_thw[{i}] = {row}: h and w must be multiples of the merge size {merge}")
        out.append(row)
    if not out:
        raise ValueError("grid_thw is empty: at least one image or video entry is needed")
    return tuple(out)


def vision_output_rows(grid_thw: Iterable, merge: int) -> list[int]:
    """The embedding rows (placeholder tokens) of each entry: t*h*w / merge^2."""
    return [t * h * w // (merge * merge) for t, h, w in parse_grids(grid_thw, merge)]


def _block_order(a: torch.Tensor, merge: int) -> torch.Tensor:
    """[h, w, ...] in row-major patch order -> [h*w, ...] in merge-block-major order."""
    h, w = a.shape[:2]
    rest = a.shape[2:]
    return a.reshape(h // merge, merge, w // merge, merge, *rest).transpose(1, 2).reshape(h * w, *rest)


def _axis_taps(n: int, side: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bilinear taps (align_corners) of n target positions on a source axis of `side` entries:
    (lower index, upper index, weight of the upper) with the lower's weight 1 - that."""
    src = torch.arange(n, dtype=torch.float32, device=device) * (side - 1) / max(n - 1, 1)
    lo = src.floor()
    frac = src - lo
    lo_i = lo.long().clamp(max=side - 1)
    return lo_i, (lo_i + 1).clamp(max=side - 1), frac


class VisionTower:
    """The tower's forward over a VisionView (module docstring). `attention`: "sdpa" | "reference" | None
    (sdpa on CUDA, reference elsewhere)."""

    def __init__(self, view: VisionView, dims: Qwen36Dims | VisionDims, device: torch.device | str,
                 dtype: torch.dtype, attention: str | None = None,
                 sdpa_backends: Sequence[str] | None = SDPA_BACKENDS, gelu_epilogue: bool = GELU_EPILOGUE) -> None:
        v = dims.vision if isinstance(dims, Qwen36Dims) else dims
        if v is None:
            raise ValueError("this model identity has no vision tower (its dims carry no vision facts)")
        if v.hidden_size % v.num_heads:
            raise ValueError(f"vision hidden_size {v.hidden_size} is not a multiple of num_heads {v.num_heads}")
        self.view, self.vdims = view, v
        self.device, self.dtype = torch.device(device), dtype
        if attention is None:
            attention = "sdpa" if self.device.type == "cuda" else "reference"
        if attention not in ("sdpa", "reference"):
            raise ValueError(f"attention must be 'sdpa' or 'reference', got {attention!r}")
        self.attention = attention
        self._sdpa_backends = _sdpa_backends(sdpa_backends) if attention == "sdpa" else None
        self.gelu_epilogue = gelu_epilogue and self.device.type == "cuda"
        self._rope_ = None
        if attention == "sdpa" and self.device.type == "cuda" and fast_available():
            from ninfer.ops.triton.vision_rope import vision_rope_
            self._rope_ = vision_rope_
        self.merge = v.spatial_merge_size
        self.heads = v.num_heads
        self.head_dim = v.hidden_size // v.num_heads
        self.side = int(round(v.num_position_embeddings ** 0.5))
        if self.side * self.side != v.num_position_embeddings:
            raise ValueError(f"num_position_embeddings {v.num_position_embeddings} is not a square")
        if self.head_dim % 4:
            raise ValueError(f"vision head_dim {self.head_dim} must be a multiple of 4 (2D rotary)")
        half = self.head_dim // 2
        # NOTE: computed on the CPU in fp32 as transformers does, then moved: the same frequencies bit for bit.
        self.inv_freq = (1.0 / (ROPE_THETA ** (torch.arange(0, half, 2, dtype=torch.float) / half))).to(self.device)
        self.patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size

    # ---- per-grid tables ----
    def position_table(self, h: int, w: int) -> torch.Tensor:
        """[h*w, C] fp32: the learned S x S table resampled to h x w (bilinear, align_corners), in
        merge-block-major patch order."""
        S, C = self.side, self.vdims.hidden_size
        table = self.view.pos_embed.float().view(S, S, C)
        r0, r1, fr = _axis_taps(h, S, self.device)
        c0, c1, fc = _axis_taps(w, S, self.device)
        rows = table[r0] * (1 - fr)[:, None, None] + table[r1] * fr[:, None, None]            # [h, S, C]
        grid = rows[:, c0] * (1 - fc)[None, :, None] + rows[:, c1] * fc[None, :, None]       # [h, w, C]
        return _block_order(grid, self.merge)

    def rotary_table(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [h*w, D] fp32 of the patches of an h x w frame, in merge-block-major order."""
        rc = torch.stack(torch.meshgrid(torch.arange(h, device=self.device), torch.arange(w, device=self.device),
                                        indexing="ij"), dim=-1)                                # [h, w, 2]
        rc = _block_order(rc, self.merge).float()                                              # [h*w, 2]
        ang = (rc[:, :, None] * self.inv_freq).reshape(h * w, -1)                              # [row f | col f]
        emb = torch.cat([ang, ang], dim=-1)
        return emb.cos(), emb.sin()

    def activation_bytes(self, grid_thw: Iterable) -> int:
        """An upper bound of the memory one `forward` over these entries allocates beyond the weights (its
        output included), for planning a workspace: the resident x, rotary tables and a cast copy of the
        input, plus the largest of the phases (an entry's position table in fp32; a block: its qkv and
        attention buffers or its MLP's two [N, I]; the merger), plus the forms' extras (the PyTorch rotary's
        fp32 copies, the reference attention's [heads, L, L] scores)."""
        grids = parse_grids(grid_thw, self.merge)
        v, e = self.vdims, torch.empty((), dtype=self.dtype).element_size()
        C, I, D, S, m2 = v.hidden_size, v.intermediate_size, self.head_dim, self.side, self.merge ** 2
        n = sum(t * h * w for t, h, w in grids)
        fixed = n * C * e + 2 * n * D * 4 + n * self.patch_dim * e
        tables = max(S * S * C * 4 + 3 * h * S * C * 4 + 3 * h * w * C * 4 + 2 * h * w * D * 4 for _, h, w in grids)
        block = max(5 * n * C * e, n * C * e + 2 * n * I * e)
        if self._rope_ is None:
            block += 3 * n * C * e + 8 * n * C * 4
        if self.attention == "reference":
            block += max(3 * h * w * C * 4 + 3 * v.num_heads * (h * w) ** 2 * 4 for _, h, w in grids)
        merger = 3 * n * C * e + n // m2 * v.out_hidden_size * e
        return fixed + max(tables, block, merger) + (8 << 20)

    # ---- forward ----
    @torch.no_grad()
    def forward(self, pixel_values: torch.Tensor, grid_thw: Sequence) -> torch.Tensor:
        """pixel_values [N, C_in*T*P*P], grid_thw (t, h, w) per entry -> [N / m^2, out_hidden_size] (dtype)."""
        grids = parse_grids(grid_thw, self.merge)
        if pixel_values.dim() != 2 or pixel_values.shape[1] != self.patch_dim:
            raise ValueError(f"pixel_values must be [patches, {self.patch_dim}] "
                             f"(C_in*T*P*P), got {list(pixel_values.shape)}")
        n = sum(t * h * w for t, h, w in grids)
        if pixel_values.shape[0] != n:
            raise ValueError(f"pixel_values has {pixel_values.shape[0]} patches, grid_thw {list(grids)} "
                             f"describes {n}")
        V, C = self.view, self.vdims.hidden_size
        x = F.linear(pixel_values.to(device=self.device, dtype=self.dtype), V.patch_weight, V.patch_bias)
        cos = torch.empty(n, self.head_dim, dtype=torch.float32, device=self.device)
        sin = torch.empty_like(cos)
        start = 0
        for t, h, w in grids:
            L = h * w
            seg = x[start:start + t * L].view(t, L, C)
            seg.add_(self.position_table(h, w).to(self.dtype))
            c, s = self.rotary_table(h, w)
            cos[start:start + t * L].view(t, L, -1).copy_(c)
            sin[start:start + t * L].view(t, L, -1).copy_(s)
            start += t * L
        for blk in V.blocks:
            self._block(x, blk, grids, cos, sin)
        y = F.layer_norm(x, (C,), V.merger_norm_weight, V.merger_norm_bias, LN_EPS)
        y = y.view(-1, C * self.merge * self.merge)
        y = F.gelu(F.linear(y, V.merger_fc1_weight, V.merger_fc1_bias))
        return F.linear(y, V.merger_fc2_weight, V.merger_fc2_bias)

    __call__ = forward

    def _block(self, x: torch.Tensor, blk: VisionBlockWeights, grids, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """One block on x [N, C] in place (the residual adds; every other tensor is freed before the next)."""
        C = self.vdims.hidden_size
        h = F.layer_norm(x, (C,), blk.norm1_weight, blk.norm1_bias, LN_EPS)
        qkv = F.linear(h, blk.qkv_weight, blk.qkv_bias).view(-1, 3, self.heads, self.head_dim)
        del h
        if self._rope_ is not None:
            self._rope_(qkv, cos, sin)
            q, k, v = qkv.unbind(1)
        else:
            qk = _rotate(qkv[:, :2], cos, sin).to(self.dtype)                                # [N, 2, H, D]
            q, k, v = qk[:, 0], qk[:, 1], qkv[:, 2]
            del qk
        a = (self._attend_sdpa if self.attention == "sdpa" else self._attend_reference)(q, k, v, grids)
        del q, k, v, qkv
        x.add_(F.linear(a, blk.proj_weight, blk.proj_bias))
        del a
        h = F.layer_norm(x, (C,), blk.norm2_weight, blk.norm2_bias, LN_EPS)
        if self.gelu_epilogue:       # cuBLASLt's bias + tanh-GELU epilogue on the fp32 accumulator
            h = torch._addmm_activation(blk.fc1_bias, h, blk.fc1_weight.t(), use_gelu=True)
        else:
            h = F.gelu(F.linear(h, blk.fc1_weight, blk.fc1_bias), approximate="tanh")
        x.add_(F.linear(h, blk.fc2_weight, blk.fc2_bias))

    def _attend_reference(self, q, k, v, grids) -> torch.Tensor:
        """q, k, v [N, H, D] -> [N, H*D]: per frame softmax(q k^T / sqrt(D)) v in fp32."""
        out = torch.empty(q.shape[0], self.heads * self.head_dim, dtype=self.dtype, device=q.device)
        scale = self.head_dim ** -0.5
        start = 0
        for t, h, w in grids:
            L = h * w
            for _ in range(t):
                sl = slice(start, start + L)
                qf, kf, vf = (z[sl].float().transpose(0, 1) for z in (q, k, v))           # [H, L, D]
                p = torch.softmax(qf @ kf.transpose(1, 2) * scale, dim=-1)
                out[sl] = (p @ vf).transpose(0, 1).reshape(L, -1).to(self.dtype)
                start += L
        return out

    def _attend_sdpa(self, q, k, v, grids) -> torch.Tensor:
        """q, k, v [N, H, D] -> [N, H*D]: one scaled_dot_product_attention per entry, its t frames a batch."""
        out = torch.empty(q.shape[0], self.heads * self.head_dim, dtype=self.dtype, device=q.device)
        start = 0
        for t, h, w in grids:
            L = h * w
            sl = slice(start, start + t * L)
            qs, ks, vs = (z[sl].view(t, L, self.heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
            if self._sdpa_backends is None:
                o = F.scaled_dot_product_attention(qs, ks, vs, scale=self.head_dim ** -0.5)  # [t, H, L, D]
            else:
                with sdpa_kernel(self._sdpa_backends, set_priority=True):
                    o = F.scaled_dot_product_attention(qs, ks, vs, scale=self.head_dim ** -0.5)
            out[sl].view(t, L, self.heads, self.head_dim).copy_(o.transpose(1, 2))
            start += t * L
        return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary in fp32 over the whole head: x [N, ..., D], cos/sin [N, D] -> x*cos + rotate_half(x)*sin."""
    x = x.float()
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
    c, s = cos.view(shape), sin.view(shape)
    x1, x2 = x.chunk(2, dim=-1)
    return x * c + torch.cat([-x2, x1], dim=-1) * s
