"""Record the example trace shipped in the package (``xpuprof/data``).

A real PyTorch profiler (Kineto) trace of a few training steps of a small transformer on the CPU,
so ``xpuprof demo`` and the tests have a genuine trace without any GPU. Re-run to refresh it:

    python scripts/record_example.py src/xpuprof/data/example_cpu_train.pt.trace.json.gz

Absolute paths in the trace (``traceName``) are replaced by the file name, so the shipped file
carries nothing of the machine that recorded it.
"""

from __future__ import annotations

import gzip
import json
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def main(out: Path) -> None:
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 512, (8, 33))
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"

        def save(p: profile) -> None:
            p.export_chrome_trace(str(raw))

        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=3),
            on_trace_ready=save,
            record_shapes=True,
            profile_memory=True,
        ) as prof:
            for _ in range(5):
                logits = model(data[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, 512), data[:, 1:].reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                prof.step()
        trace = json.loads(raw.read_text())
    trace["traceName"] = out.name
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", compresslevel=9) as f:
        json.dump(trace, f)
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(trace['traceEvents'])} events)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "example.pt.trace.json.gz"))
