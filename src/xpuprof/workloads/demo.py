"""The built-in demo workload: a small transformer language model trained on random tokens.

It is what ``xpuprof demo`` profiles, what the capture-overhead benchmark measures, and what
``scripts/record_example.py`` recorded for the shipped example trace. Small enough to train a
step in tens of milliseconds on a laptop CPU, real enough to have every kind of layer a user's
model has: embedding, attention, MLP, layer norms, a loss and an optimizer.
"""

from __future__ import annotations

from typing import Any

from xpuprof.capture.torch import require_torch


def build_model(
    vocab: int = 512, d: int = 128, heads: int = 4, layers: int = 4, seed: int = 0
) -> Any:
    """A pre-norm transformer LM: embedding → ``layers`` blocks → vocabulary head."""
    torch = require_torch()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
            self.norm2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x: Any) -> Any:
            h = self.norm1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.norm2(x))

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.head = nn.Linear(d, vocab)

        def forward(self, tokens: Any) -> Any:
            return self.head(self.blocks(self.embed(tokens)))

    torch.manual_seed(seed)
    return TinyLM()


class Trainer:
    """One optimizer step per ``step()``; the batch is fixed so every step does equal work."""

    def __init__(self, batch: int = 8, seq: int = 64, vocab: int = 512, **model: Any) -> None:
        torch = require_torch()
        self.torch = torch
        self.vocab = vocab
        self.model = build_model(vocab=vocab, **model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        self.data = torch.randint(0, vocab, (batch, seq + 1), generator=g)

    def step(self) -> float:
        logits = self.model(self.data[:, :-1])
        loss = self.torch.nn.functional.cross_entropy(
            logits.reshape(-1, self.vocab), self.data[:, 1:].reshape(-1)
        )
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.item()
