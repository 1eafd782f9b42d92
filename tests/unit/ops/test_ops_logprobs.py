import pytest
import torch

from ninfer.ops.reference.logprobs import chunked_logprobs, logprobs_from_logits
from support.ops_util import DEVICES
from support.numerics import rel_rms

H, V = 32, 1000


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", [1, 63, 65])
@pytest.mark.parametrize("chunk_tokens", [1, 7, 64, 1000])
def test_chunked_equals_full(device, T, chunk_tokens):
    g = torch.Generator().manual_seed(T)
    hidden = torch.randn(T, H, generator=g).to(device)
    head = torch.randn(V, H, generator=g).to(device) * 0.3
    tgt = torch.randint(0, V, (T,), generator=g).to(device)
    r = chunked_logprobs(hidden, head, tgt, top_k=20, max_chunk_bytes=chunk_tokens * V * 4)
    full = torch.log_softmax((hidden.double() @ head.double().T), -1)
    assert rel_rms(r.token_logprobs, full.gather(1, tgt[:, None])[:, 0]) < 1e-6
    assert rel_rms(r.top_logprobs, full.topk(20, -1).values) < 1e-6
    assert torch.equal(r.top_ids.cpu(), full.topk(20, -1).indices.cpu())
    exp_rank = (full > full.gather(1, tgt[:, None])).sum(-1) + 1
    assert torch.equal(r.token_ranks.cpu(), exp_rank.cpu())


def test_bf16_no_targets_and_empty():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(10, H, generator=g).bfloat16()
    head = (torch.randn(V, H, generator=g) * 0.3).bfloat16()
    r = chunked_logprobs(hidden, head, None, top_k=3, max_chunk_bytes=1)
    assert r.token_logprobs is None and r.token_ranks is None and r.top_ids.shape == (10, 3)
    ref = logprobs_from_logits(hidden @ head.T, None, 3)
    torch.testing.assert_close(r.top_logprobs, ref.top_logprobs, rtol=0, atol=0)
    e = chunked_logprobs(hidden[:0], head, torch.zeros(0, dtype=torch.long), top_k=2)
    assert e.token_logprobs.shape == (0,) and e.top_ids.shape == (0, 2)
