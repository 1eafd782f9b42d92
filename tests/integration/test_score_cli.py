"""`ninfer score`: JSONL / plain-text input, per-document results equal transformers, summary line."""
from __future__ import annotations

import json
import math

import pytest
import torch

from support.program_util import hf_model
from ninfer.gateway.cli.main import main
from ninfer.targets.qwen3_6.frontend import Qwen36Frontend

REL = 1e-5


def _full_logprobs(ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf_model("dense")(torch.tensor([ids])).logits[0].float(), dim=-1)


def _sum(lp: torch.Tensor, ids: list[int], start: int) -> float:
    return sum(lp[j - 1, ids[j]].item() for j in range(max(1, start), len(ids)))


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["score", *map(str, argv)])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_jsonl_text_and_continuation_documents(tiny_artifact_path, tmp_path, capsys):
    model = tiny_artifact_path("dense", layout="text")
    docs = [{"text": "Perplexity measures how well a model predicts a sample of text."},
            {"context": "Question: what colour is the sky?\nAnswer: ", "continuation": "blue"},
            {"text": "Short."}]
    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(json.dumps(d) for d in docs) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    code, stdout, err = _run(capsys, model, "--input", src, "--output", out, "--max-model-len", 64,
                             "--per-token", "--top-k", 2, "--no-progress")
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2]
    tok = Qwen36Frontend.builtin().tokenizer
    # document 0: every token but the first
    ids = tok.encode(docs[0]["text"])
    lp = _full_logprobs(ids)
    assert rows[0]["token_ids"] == ids and rows[0]["num_scored_tokens"] == len(ids) - 1
    assert abs(rows[0]["logprob"] - _sum(lp, ids, 1)) / abs(_sum(lp, ids, 1)) < REL
    assert rows[0]["token_logprobs"][0] is None and len(rows[0]["token_logprobs"]) == len(ids)
    assert math.isclose(rows[0]["perplexity"], math.exp(-rows[0]["logprob"] / (len(ids) - 1)), rel_tol=1e-12)
    assert all(len(t) == 2 for t in rows[0]["top_logprobs"][1:])
    # document 1: the context's trailing space moves to the continuation (as lm-evaluation-harness)
    ctx = tok.encode("Question: what colour is the sky?\nAnswer:")
    cont = tok.encode(" blue")
    ids = ctx + cont
    lp = _full_logprobs(ids)
    assert rows[1]["num_context_tokens"] == len(ctx) and rows[1]["num_scored_tokens"] == len(cont)
    assert abs(rows[1]["logprob"] - _sum(lp, ids, len(ctx))) / abs(_sum(lp, ids, len(ctx))) < REL
    # summary line: corpus perplexity over all scored tokens
    total_lp = sum(r["logprob"] for r in rows)
    total_scored = sum(r["num_scored_tokens"] for r in rows)
    summary = [line for line in err.splitlines() if line.startswith("[score]")]
    assert len(summary) == 1
    assert f"documents=3" in summary[0] and f"scored_tokens={total_scored}" in summary[0]
    assert f"perplexity={math.exp(-total_lp / total_scored):.4f}" in summary[0]
    assert "tokens/s=" in summary[0]


def test_plain_text_with_window_and_stride_to_stdout(tiny_artifact_path, tmp_path, capsys):
    model = tiny_artifact_path("dense", layout="text")
    text = ("The quick brown fox jumps over the lazy dog. " * 7).strip()
    src = tmp_path / "doc.txt"
    src.write_text(text, encoding="utf-8")
    code, stdout, err = _run(capsys, model, "--input", src, "--window", 40, "--stride", 24)
    assert code == 0, err
    [row] = [json.loads(line) for line in stdout.splitlines()]
    ids = Qwen36Frontend.builtin().tokenizer.encode(text)
    assert len(ids) > 40 and row["num_tokens"] == len(ids) and row["num_scored_tokens"] == len(ids) - 1
    # the recipe by hand: windows of 40 moved by 24, each token scored once in the window that reaches it
    ref, prev_end = 0.0, 0
    for begin in range(0, len(ids), 24):
        end = min(begin + 40, len(ids))
        lp = _full_logprobs(ids[begin:end])
        ref += sum(lp[j - begin - 1, ids[j]].item() for j in range(max(prev_end, begin + 1), end))
        prev_end = end
        if end == len(ids):
            break
    assert abs(row["logprob"] - ref) / abs(ref) < REL
    assert "scoring" in err                      # the progress bar


@pytest.mark.parametrize("content,message", [
    ('{"text": 3}\n', "needs a string field"),
    ('{"text": "a"}\nnot json\n', "not a JSON object"),
])
def test_bad_input_is_one_line_error(tiny_artifact_path, tmp_path, capsys, content, message):
    src = tmp_path / "bad.jsonl"
    src.write_text(content, encoding="utf-8")
    code, _, err = _run(capsys, tiny_artifact_path("dense", layout="text"), "--input", src)
    assert code == 2 and message in err and "Traceback" not in err


def test_stride_larger_than_window_is_refused(tiny_artifact_path, tmp_path, capsys):
    src = tmp_path / "doc.txt"
    src.write_text("hello world", encoding="utf-8")
    code, _, err = _run(capsys, tiny_artifact_path("dense", layout="text"), "--input", src, "--window", 8,
                        "--stride", 9)
    assert code == 2 and "--stride" in err


def test_unwritable_output_is_refused_before_the_model_loads(tmp_path):
    import subprocess
    import sys

    doc = tmp_path / "doc.txt"
    doc.write_text("hello world\n")
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-m", "ninfer", "score", "--input", str(doc),
                           "-o", str(tmp_path / "missing" / "out.jsonl")],
                          capture_output=True, text=True, timeout=60, env={"NINFER_CACHE_DIR": str(cache),
                                                                          "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"ninfer score: error: cannot write {tmp_path / 'missing' / 'out.jsonl'}: "
        f"directory {tmp_path / 'missing'} does not exist"]
    assert not cache.exists()                    # nothing was built or loaded


def test_top_k_needs_per_token_and_the_summary_counts_tokens_as_the_records_do(tiny_artifact_path, tmp_path,
                                                                                capsys):
    model = tiny_artifact_path("dense", layout="text")
    src = tmp_path / "doc.txt"
    src.write_text("The sky is blue.", encoding="utf-8")
    code, out, err = _run(capsys, model, "--input", src, "--top-k", 3)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and "--top-k needs --per-token" in lines[0]
    # --add-bos: the summary's tokens are the records' num_tokens (BOS included)
    code, out, err = _run(capsys, model, "--input", src, "--add-bos", "--no-progress")
    assert code == 0, err
    [row] = [json.loads(line) for line in out.splitlines()]
    assert row["num_tokens"] == len(Qwen36Frontend.builtin().tokenizer.encode("The sky is blue.")) + 1
    [summary] = [line for line in err.splitlines() if line.startswith("[score]")]
    assert f"tokens={row['num_tokens']} " in summary and f"scored_tokens={row['num_scored_tokens']} " in summary
