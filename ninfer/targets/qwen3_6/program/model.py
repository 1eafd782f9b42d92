"""The family schedule of the Qwen3.6 language model over paged KV and StateImage entries.

One forward runs a packed batch of B rows (row b: `seqlens[b]` new tokens at positions
`starts[b]...`). Every layer is run through the package's leaves; the schedule itself touches
only sequence state (paged KV, conv and recurrent state) and contains no branch on the target
identity. The layer kind (GDN or attention) comes from the dimension facts.

    x = embed(ids)
    per layer:  x += mixer(rms_norm1p(x))        GDN: leaf.project -> conv(state) -> delta rule(state) -> leaf.output
                                                 attn: leaf.project (q/k norm + rotary, k/v into the pages in
                                                       the same op) -> paged attention (decode: and the
                                                       output gate) -> leaf.output
                x += post_mixer(rms_norm1p(x))
    h = rms_norm1p(x);  logits = h @ lm_head.T   (fp32)

State entries name StateImageStore entries (a sequence's slot or a provisional scratch entry);
the conv and delta-rule ops read and update them in place.

Side stream (the decode graph's body, `decode_static`, on CUDA with the fast GEMV; SIDE_GATE): the rows
of a mixer's in_proj that only its output gate reads (GDN z, the attention gate) are a second GEMV on a
side stream, so their weight stream runs while the main stream does the state step (GDN conv + delta
rule) or the paged attention, which leave HBM mostly idle; the main stream joins it right before the
gate is read (the GDN gated norm, the attention's merge). At one row (B=1) only (docs/performance.md,
"Decision log").
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ninfer.program.stores import PagedKVStore, StateImageStore
from ninfer.ops.opset import OpSet, select_ops
from ninfer.ops.reference.fused import NormedRows, Residual, materialize
from ninfer.ops.reference.rope import mrope_cos_sin, rope_inv_freq
from ninfer.targets.qwen3_6.program.leaves import LeafSet
from ninfer.targets.qwen3_6.program.model_view import LayerView, ModelView


# NOTE: read at each decode_static call (the decode graphs' capture); on because it shortens the B=1 step
#       (docs/performance.md, "Decision log").
SIDE_GATE = True


class SideGemv:
    """The side stream of the mixers' gate rows (module docstring) and the fork onto it: both GEMVs read
    the same input, so the side one forks before the main one is issued and they start together; the
    SMs take the main GEMV's blocks first (issued first), the gate's fill its tail and the state step.
    Used for one-row graphs only: at more rows it lengthens the step (the M > 1 tiles of the split shapes
    are not tuned; docs/performance.md, "Decision log")."""

    def __init__(self, device: torch.device) -> None:
        from ninfer.ops.triton import gemv
        self._gemv = gemv
        self.stream = torch.cuda.Stream(device)

    def pair(self, ops, h, w: torch.Tensor, split: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(h @ w[:split].T on the current stream, h @ w[split:].T on the side stream); the caller joins
        (`join`, or an op's `gate_stream=`) before reading the second. A split-K half keeps the second
        GEMV on the current stream, after the first (the split-K GEMV's arrival counters are shared by
        every launch of a device); the fork and join then order nothing."""
        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)
        y = ops.linear(h, w[:split])
        beside = all(self._gemv.concurrent_ok(n, w.shape[1], 1) for n in (split, w.shape[0] - split))
        # NOTE: the side output is allocated on the side stream and read on the main one after the join;
        #       it is not recorded on the main stream: the side stream's next allocation comes after its
        #       next fork, which orders it after everything the main stream issued before (its readers).
        with torch.cuda.stream(self.stream if beside else main):
            g = ops.linear(h, w[split:])
        return y, g

    def join(self) -> None:
        torch.cuda.current_stream().wait_stream(self.stream)


@functools.cache
def _side_gemv(device: torch.device) -> SideGemv:
    return SideGemv(device)


class ForwardBatch(NamedTuple):
    input_ids: torch.Tensor            # [N] int64, rows packed one after another
    positions: torch.Tensor            # [N] int64 logical position of each token in its sequence
    seqlens: tuple[int, ...]           # [B] new tokens per row
    starts: tuple[int, ...]            # [B] position of each row's first new token (its frontier)
    state_entries: torch.Tensor        # [B] int64 StateImageStore entries, read and updated in place
    block_tables: torch.Tensor         # [B, W] int32 physical page ids
    rope_positions: torch.Tensor | None = None   # [3, N] MRoPE positions; None = text (all axes = positions)
    embeds: tuple[torch.Tensor, torch.Tensor] | None = None   # (rows [M], values [M, H]): these token rows take
                                                               # the given embeddings instead of the table's (media)


def state_planes(dims, dtype: torch.dtype, mtp: bool = False) -> dict[str, tuple]:
    """The StateImage planes the schedule reads and updates, per GDN layer and entry:
    conv [C, K-1] in the model dtype, recurrent [nv, dk, dv] in fp32; with `mtp` (speculation), one more
    plane of one layer: mtp_hidden [H] in the model dtype, the main model's final hidden state at the
    entry's frontier - 1 (what the MTP layer drafts from: speculate.py)."""
    planes = {"conv": ((dims.conv_dim, dims.linear_conv_kernel_dim - 1), dtype),
              "recurrent": ((dims.linear_num_value_heads, dims.linear_key_head_dim, dims.linear_value_head_dim),
                            torch.float32)}
    if mtp:
        planes["mtp_hidden"] = ((dims.hidden_size,), dtype, 1)
    return planes


class Qwen36Model:
    def __init__(self, view: ModelView, leaves: LeafSet, kv: PagedKVStore, state: StateImageStore,
                 ops: OpSet | None = None) -> None:
        d = view.dims
        self.view, self.leaves, self.kv, self.state = view, leaves, kv, state
        # NOTE: the state-touching ops: fast (Triton / fla) on CUDA, the PyTorch references elsewhere.
        self.ops = ops if ops is not None else select_ops(view.embed_tokens.device)
        self.dims = d
        self.eps = d.rms_norm_eps
        self._attn_index = {li: n for n, li in enumerate(d.attention_layers)}
        if view.mtp is not None:
            self._attn_index[view.mtp.layer.index] = len(d.attention_layers)
        self._gdn_index = {li: n for n, li in enumerate(d.gdn_layers)}
        nk, dk, dv = d.linear_num_key_heads, d.linear_key_head_dim, d.linear_value_head_dim
        self._qkv_split = (nk * dk, nk * dk, d.linear_num_value_heads * dv)
        # NOTE: text rotary tables of the static decode path, made once on the device (mrope_cos_sin
        #       builds them per call from host lists: a host-to-device copy, not graph-capturable).
        self._rot = int(d.head_dim * d.partial_rotary_factor)
        self._inv_freq = rope_inv_freq(self._rot, d.rope_theta, view.embed_tokens.device)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Run every layer; return the post-final-norm hidden states [N, H] (also MTP's input)."""
        d = self.dims
        x = F.embedding(fb.input_ids, self.view.embed_tokens)
        if fb.embeds is not None:
            x = x.index_copy(0, fb.embeds[0], fb.embeds[1].to(x.dtype))
        pos = fb.rope_positions if fb.rope_positions is not None else fb.positions
        cos, sin = mrope_cos_sin(pos, head_dim=d.head_dim, partial_rotary_factor=d.partial_rotary_factor,
                                 mrope_section=d.mrope_section, rope_theta=d.rope_theta,
                                 interleaved=d.mrope_interleaved)
        return self._layers(x, cos, sin, fb, _RowMeta.of(fb, x.device))

    def decode_static(self, input_ids: torch.Tensor, positions: torch.Tensor, state_entries: torch.Tensor,
                      block_tables: torch.Tensor, context_lens: torch.Tensor, rows: torch.Tensor,
                      src_entries: torch.Tensor | None = None, rope_positions: torch.Tensor | None = None
                      ) -> torch.Tensor:
        """One text token per row from device tensors only (the CUDA-graph body): no host sync, no
        host-to-device copy, no branch on tensor values. input_ids/positions/state_entries/
        context_lens/rows [B] int64 (rows = arange(B)), block_tables [B, W] page ids.
        src_entries [B]: when given, the conv and delta-rule ops read each row's state there and
        write the stepped state at state_entries (src is never written: no separate state copy).
        rope_positions [B]: the rotary position of each row's token on every axis (default: positions; after
        media in the prompt it is the KV position + the prompt's rope delta).
        Same result as `forward` of a decode batch (text positions: every MRoPE axis = position)."""
        x = F.embedding(input_ids, self.view.embed_tokens)
        theta = (positions if rope_positions is None else rope_positions).float().unsqueeze(-1) * self._inv_freq
        emb = torch.cat([theta, theta], dim=-1)
        B = input_ids.shape[0]
        fb = ForwardBatch(input_ids, positions, (1,) * B, (), state_entries, block_tables)
        side = _side_gemv(x.device) if SIDE_GATE and B == 1 and x.is_cuda and self.ops.name == "fast" else None
        # NOTE: cu_seqlens is read only by the prefill forms; in decode it is rows (unused).
        return self._layers(x, emb.cos(), emb.sin(), fb, _RowMeta(True, rows, rows, context_lens, src_entries,
                                                                   side=side))

    def prefill_static(self, input_ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
                       valid: torch.Tensor, cu_seqlens: torch.Tensor, state_entries: torch.Tensor,
                       block_tables: torch.Tensor, start: torch.Tensor,
                       rope_delta: torch.Tensor | None = None) -> torch.Tensor:
        """One prompt stage of one sequence at positions start.., padded to a fixed row count N, from
        device tensors only (the prefill graphs' body, prefill_graphs.py): no host sync, no host-to-device
        copy, no branch on tensor values. input_ids / positions / rows [N] int64, positions = start +
        arange(N), rows 0 for the L real tokens and 1 for the padding after them; valid [N] bool (rows ==
        0); cu_seqlens [2] int64 = [0, L]; state_entries [1], the state after the prefix (zero for start
        0), read and updated in place; block_tables [2, W]: row 0 the sequence's pages (its prefix's KV
        is read there), row 1 pages that only the padding's KV is written to, both W >= (start + N) /
        page_size; start [1] int64; rope_delta [1] int64 (None: 0): every token rotates at its position +
        rope_delta on every MRoPE axis (text after media).
        Returns hidden [N, H]: rows < L are `forward` of the L tokens over the prefix (those rotary positions),
        and the state and KV written are theirs. The padding is read by no real token (causal), and it
        enters the delta rule as q = k = v = 0, g = 0, beta = 0 (no decay, no update); the conv's state
        is taken at L."""
        x = F.embedding(input_ids, self.view.embed_tokens)
        rot = positions if rope_delta is None else positions + rope_delta
        theta = rot.float().unsqueeze(-1) * self._inv_freq                # [N, rot/2]
        emb = torch.cat([theta, theta], dim=-1)
        N = input_ids.shape[0]
        fb = ForwardBatch(input_ids, positions, (N,), (0,), state_entries, block_tables)
        return self._layers(x, emb.cos(), emb.sin(), fb, _RowMeta(False, cu_seqlens, rows, start + cu_seqlens[1:],
                                                                   valid=valid, start=start))

    def verify_static(self, input_ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
                      src_entries: torch.Tensor, step_dst: torch.Tensor, block_tables: torch.Tensor,
                      cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """T tokens per row (a speculative round's verify block), B rows, N = B * T, row-major: from device
        tensors only (the verify graph's body; also its eager form). input_ids / positions / rows [N] int64
        (rows = row of each token), src_entries [B]: each row's state; step_dst [B, T]: token t's state is
        written at step_dst[:, t] (read from step_dst[:, t-1], or src for t = 0; src is never written);
        block_tables [B, W]. Every token attends causally over its row's pages (KV of all T written first).
        cos_sin: the rotary tables [N, rot] (default: text positions from `positions` on the device).
        Returns the post-final-norm hidden [N, H]; token t of row b is what a decode step at that
        position, after the row's tokens before it, returns."""
        x = F.embedding(input_ids, self.view.embed_tokens)
        cos, sin = cos_sin if cos_sin is not None else self.text_rotary(positions)
        B, T = step_dst.shape
        fb = ForwardBatch(input_ids, positions, (T,) * B, (), step_dst[:, -1], block_tables)
        meta = _RowMeta(True, rows, rows, positions + 1, src_entries,
                        token_tables=block_tables.index_select(0, rows), step_dst=step_dst)
        return self._layers(x, cos, sin, fb, meta)

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of text positions [N] as `forward` builds them (the eager paths' tables)."""
        d = self.dims
        return mrope_cos_sin(positions, head_dim=d.head_dim, partial_rotary_factor=d.partial_rotary_factor,
                             mrope_section=d.mrope_section, rope_theta=d.rope_theta, interleaved=d.mrope_interleaved)

    def text_rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [N, rot] of text positions [N] (every MRoPE axis = position), on the device."""
        theta = positions.float().unsqueeze(-1) * self._inv_freq
        emb = torch.cat([theta, theta], dim=-1)
        return emb.cos(), emb.sin()

    # ---- the MTP layer (view.mtp; its KV is the paged store's layer after the main attention layers) ----
    def _mtp_input(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """fc([norm_embedding(embed(ids)) | norm_hidden(hidden)]) [N, H]."""
        m = self.view.mtp
        e = F.embedding(input_ids, self.view.embed_tokens)
        ne = materialize(self.ops.add_rms_norm(e, None, m.norm_embedding, self.eps)[0], self.ops)
        nh = materialize(self.ops.add_rms_norm(hidden.to(e.dtype), None, m.norm_hidden, self.eps)[0], self.ops)
        return self.ops.linear(torch.cat([ne, nh], dim=-1), m.fc)

    def mtp_kv(self, hidden: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
               block_tables: torch.Tensor) -> None:
        """Write the MTP layer's K, V of N positions: entry i pairs the main model's final hidden of position
        positions[i] with the token after it, input_ids[i]; rows [N] name each entry's row of block_tables.
        Only the KV is computed (what later MTP steps attend to), not the layer's output. Graph-safe."""
        layer = self.view.mtp.layer
        h, _ = self._norm(self._mtp_input(hidden, input_ids), None, layer.input_norm)
        cos, sin = self.text_rotary(positions)
        k_cache, v_cache = self.kv.layer(self._attn_index[layer.index])
        self.leaves.attention.project(layer.mixer, h, cos, sin, (k_cache, v_cache, block_tables, positions, rows),
                                      self.ops)

    def mtp_observe(self, src: torch.Tensor, hidden: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
                    rows: torch.Tensor, block_tables: torch.Tensor, dst: torch.Tensor) -> None:
        """After B rows fed T tokens each (N = B * T, row-major; input_ids, positions, rows [N]) from the states at
        src [B] into dst [N] (the entry of each token's state), with final hidden states `hidden` [N, H]: the MTP
        KV of each token's position - 1 (the hidden state before it with the token itself; a position 0 has no
        such pair and writes position 0, which the next token's entry overwrites before any read) and each
        dst's anchor = the token's hidden state (speculate.py). Graph-safe."""
        plane = self.state.planes["mtp_hidden"][0]
        B = src.shape[0]
        prev = torch.cat([plane.index_select(0, src)[:, None], hidden.view(B, -1, hidden.shape[-1])[:, :-1]], dim=1)
        self.mtp_kv(prev.flatten(0, 1), input_ids, (positions - 1).clamp_min(0), rows, block_tables)
        plane.index_copy_(0, dst, hidden.to(plane.dtype))

    def mtp_draft_chain(self, hidden: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
                        block_tables: torch.Tensor, rows: torch.Tensor, k: int, vocab: int) -> torch.Tensor:
        """K chained MTP steps per row (speculate.py): step i at positions + i reads the previous step's output
        and draft (hidden / input_ids for i = 0); each draft is the argmax over the first `vocab` token ids.
        Returns the drafts [B, K]. Graph-safe."""
        drafts = []
        h, x = hidden, input_ids
        for i in range(k):
            h = self.mtp_step(h, x, positions + i, block_tables, rows)
            x = self.logits(h, vocab).argmax(dim=-1)
            drafts.append(x)
        return torch.stack(drafts, dim=1)

    def mtp_step(self, hidden: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
                 block_tables: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """One MTP step per row (a draft): hidden [B, H] (the main model's final hidden, or the previous
        step's output), input_ids [B] (the token after that position), positions [B] the position of the
        hidden; writes the layer's K, V there and attends over the row's MTP KV up to it. Returns the
        output after mtp.norm [B, H] (the next step's hidden; logits = `logits` of it). Graph-safe."""
        m = self.view.mtp
        x = self._mtp_input(hidden, input_ids)
        cos, sin = self.text_rotary(positions)
        B = input_ids.shape[0]
        fb = ForwardBatch(input_ids, positions, (1,) * B, (), rows, block_tables)
        return self._layers(x, cos, sin, fb, _RowMeta(True, rows, rows, positions + 1), layers=(m.layer,),
                            final_norm=m.norm)

    def _layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fb: ForwardBatch,
                meta: "_RowMeta", layers: tuple[LayerView, ...] | None = None,
                final_norm: torch.Tensor | None = None) -> torch.Tensor:
        # NOTE: each residual add is fused with the norm that follows it (ops.add_rms_norm): the
        #       mixer and post-mixer outputs are carried as `delta` into the next norm. A leaf's last
        #       projection may instead fold the add itself (`residual=x`; the fast set at one row):
        #       it returns a Residual and the next norm travels as NormedRows into the next leaf's
        #       first projection, which applies it (`ninfer.ops.reference.fused`): no norm launch in between.
        post_mixer = self.leaves.post_mixer
        folds = getattr(post_mixer, "folds_residual", False)
        delta = None
        for layer in self.view.layers if layers is None else layers:
            h, x = self._norm(x, delta, layer.input_norm)
            if layer.kind == "full_attention":
                delta = self._attention(layer, h, cos, sin, fb, meta, residual=x)
            else:
                delta = self._gdn(layer, h, fb, meta, residual=x)
            h, x = self._norm(x, delta, layer.post_norm)
            if folds:
                delta = post_mixer(layer.mlp, h, self.ops, residual=x)
            else:
                delta = post_mixer(layer.mlp, materialize(h, self.ops), self.ops)
        return materialize(self._norm(x, delta, self.view.norm if final_norm is None else final_norm)[0], self.ops)

    def _norm(self, x: torch.Tensor, delta, weight: torch.Tensor):
        """(rms_norm(x + delta), x + delta); after a folded add (delta a Residual) the norm is returned
        pending, as NormedRows."""
        if isinstance(delta, Residual):
            return NormedRows(delta.h, weight, self.eps, delta.parts), delta.h
        return self.ops.add_rms_norm(x, delta, weight, self.eps)

    def logits(self, hidden: torch.Tensor, rows: int = 0) -> torch.Tensor:
        """hidden [M, H] -> fp32 logits [M, V] (rows > 0: of the first `rows` token ids only, [M, rows])."""
        head = self.view.lm_head if rows <= 0 else self.view.lm_head[:rows]
        return self.ops.linear(hidden, head).float()

    def _attention(self, layer: LayerView, h, cos: torch.Tensor, sin: torch.Tensor,
                   fb: ForwardBatch, meta: "_RowMeta", residual: torch.Tensor | None = None):
        w = layer.mixer
        k_cache, v_cache = self.kv.layer(self._attn_index[layer.index])
        ops = self.ops
        # NOTE: the leaf's q/k norm + rotary op writes the new tokens' k, v into the pages (one launch).
        kv = (k_cache, v_cache, fb.block_tables, fb.positions, meta.rows)
        side = meta.side
        q, gate = self.leaves.attention.project(w, h, cos, sin, kv, ops, side=side)
        if meta.decode:
            # NOTE: the attention's merge applies the output gate (one launch fewer); the leaf then skips it.
            #       A side-stream gate is joined inside the op, right before the merge reads it.
            tables = fb.block_tables if meta.token_tables is None else meta.token_tables
            o = ops.decode_paged_attention(q, k_cache, v_cache, tables, meta.context_lens, gate=gate,
                                           gate_stream=None if side is None else side.stream)
            gate = None
        elif meta.valid is not None:
            # NOTE: the prefill graphs' form: the stage's start and length are device data.
            o = ops.prefix_attention_rows(q, k_cache, v_cache, fb.block_tables, meta.start, meta.cu_seqlens[1:])
        else:
            # NOTE: host copies of the row bounds: the op loops over rows on the host (no sync).
            o = ops.chunk_paged_attention(q, k_cache, v_cache, fb.block_tables, meta.host_context_lens,
                                          meta.host_cu_seqlens)
        return self.leaves.attention.output(w, o, gate, ops, residual=residual)

    def _gdn(self, layer: LayerView, h, fb: ForwardBatch, meta: "_RowMeta", residual: torch.Tensor | None = None):
        w = layer.mixer
        d = self.dims
        n = self._gdn_index[layer.index]
        conv_pool = self.state.planes["conv"][n]            # [entries, C, K-1]
        rec_pool = self.state.planes["recurrent"][n]        # [entries, nv, dk, dv] fp32
        idx = fb.state_entries
        ops = self.ops
        if meta.step_dst is not None:
            # NOTE: the verify form: T tokens per row stepped one after another, the state after each written
            #       at its own entry (any accepted prefix's state is kept; speculate.py).
            B, T = meta.step_dst.shape
            qkv, z, a, b = self.leaves.gdn.project(w, h, ops, gates=False)
            o = gdn_steps(ops, qkv.view(B, T, -1), w.conv1d, conv_pool, a.view(B, T, -1), b.view(B, T, -1),
                          w.A_log, w.dt_bias, rec_pool, meta.src_entries, meta.step_dst,
                          num_k_heads=d.linear_num_key_heads, head_k_dim=d.linear_key_head_dim,
                          head_v_dim=d.linear_value_head_dim)
            return self.leaves.gdn.output(w, o.reshape(B * T, *o.shape[2:]), z, ops, residual=residual)
        if meta.decode and meta.src_entries is not None:
            # NOTE: the graph's decode step: one op computes the gates, reads both states at src and
            #       writes them at idx.
            side = meta.side
            qkv, z, a, b = self.leaves.gdn.project(w, h, ops, gates=False, side=side)
            o = ops.gdn_conv_recurrent(qkv, w.conv1d, conv_pool, a, b, w.A_log, w.dt_bias, rec_pool,
                                       meta.src_entries, idx, num_k_heads=d.linear_num_key_heads,
                                       head_k_dim=d.linear_key_head_dim, head_v_dim=d.linear_value_head_dim)
            if side is not None:
                side.join()
            return self.leaves.gdn.output(w, o, z, ops, residual=residual)
        qkv, z, g, beta = self.leaves.gdn.project(w, h, ops)
        if meta.decode:
            u, _ = ops.causal_conv1d_update(qkv, w.conv1d, conv_pool, state_indices=idx)            # [B, C]
            q, k, v = torch.split(u.unsqueeze(1), self._qkv_split, dim=-1)               # [B, 1, *]
            g, beta = g.unsqueeze(1), beta.unsqueeze(1)
            cu = None
        else:
            # NOTE: the conv returns q, k, v as three contiguous tensors (the layout fla-core reads; the
            #       fast op writes them directly: no split-and-copy of a [1, N, C] output).
            (q, k, v), _ = ops.chunk_causal_conv1d(qkv.unsqueeze(0), w.conv1d, conv_pool, cu_seqlens=meta.cu_seqlens,
                                                   state_indices=idx, split=self._qkv_split)
            g, beta = g.unsqueeze(0), beta.unsqueeze(0)
            cu = meta.cu_seqlens
            if meta.valid is not None:
                # NOTE: the prefill graphs' padding (`prefill_static`): the conv left its rows unwritten, and
                #       as zeros they neither decay nor update the state; one sequence over all the rows.
                m = meta.valid.view(1, -1, 1)
                q, k, v, g, beta = (torch.where(m, t, 0) for t in (q, k, v, g, beta))
                cu = None
        Bq, T = q.shape[:2]
        q = q.reshape(Bq, T, d.linear_num_key_heads, d.linear_key_head_dim)
        k = k.reshape(Bq, T, d.linear_num_key_heads, d.linear_key_head_dim)
        v = v.reshape(Bq, T, d.linear_num_value_heads, d.linear_value_head_dim)
        rule = ops.fused_recurrent_gated_delta_rule if meta.decode else ops.chunk_gated_delta_rule
        o, _ = rule(q, k, v, g, beta, initial_state=rec_pool, state_indices=idx,
                    use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
        o = o.reshape(-1, d.linear_num_value_heads, d.linear_value_head_dim)          # [N, nv, dv]
        return self.leaves.gdn.output(w, o, z, ops, residual=residual)


def gdn_steps(ops: OpSet, qkv: torch.Tensor, conv_weight: torch.Tensor, conv_state: torch.Tensor, a: torch.Tensor,
              b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, rec_state: torch.Tensor, src: torch.Tensor,
              dst: torch.Tensor, **heads) -> torch.Tensor:
    """T GDN decode state steps per row: qkv [B, T, C], a, b [B, T, HV]; token t reads the states at src (t = 0)
    or dst[:, t-1] and writes them at dst[:, t]. Returns o [B, T, HV, V] (`gdn_conv_recurrent_steps`)."""
    return ops.gdn_conv_recurrent_steps(qkv, conv_weight, conv_state, a, b, A_log, dt_bias, rec_state, src, dst,
                                        **heads)


class _RowMeta(NamedTuple):
    decode: bool                       # every row has exactly one new token
    cu_seqlens: torch.Tensor           # [B+1] int64
    rows: torch.Tensor                 # [N] int64 row of each token
    context_lens: torch.Tensor         # [B] int64 tokens in each row's context incl. the new ones
    src_entries: torch.Tensor | None = None   # decode: state read here, written at state_entries
    host_cu_seqlens: torch.Tensor | None = None     # CPU copies of cu_seqlens / context_lens for the
    host_context_lens: torch.Tensor | None = None   # ops that loop over rows on the host (no sync)
    side: SideGemv | None = None       # decode graph body: the mixers' gate rows on a side stream
    valid: torch.Tensor | None = None  # prefill graph body: [N] bool, False on the padding rows
    start: torch.Tensor | None = None  # prefill graph body: [1] int64 position of the stage's first row
    token_tables: torch.Tensor | None = None  # decode form with T > 1 tokens per row: [N, W] each token's pages
    step_dst: torch.Tensor | None = None      # verify form: [B, T] entries of the state after each token

    @classmethod
    def of(cls, fb: ForwardBatch, device: torch.device) -> "_RowMeta":
        lens = torch.tensor(fb.seqlens, dtype=torch.long)
        cu = torch.zeros(len(fb.seqlens) + 1, dtype=torch.long)
        cu[1:] = torch.cumsum(lens, 0)
        rows = torch.repeat_interleave(torch.arange(len(fb.seqlens)), lens)
        ctx = torch.tensor(fb.starts, dtype=torch.long) + lens
        return cls(all(n == 1 for n in fb.seqlens), cu.to(device), rows.to(device), ctx.to(device),
                   host_cu_seqlens=cu, host_context_lens=ctx)
