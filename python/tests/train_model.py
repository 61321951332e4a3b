"""`stowage train`'s model (tools/stowage/train_model.cpp) in PyTorch, module for module
and name for name, so that its exported weights load with load_state_dict(strict=True)."""

import math

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then x + mlp(norm(x)). Causal attention."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.attention_out = nn.Linear(width, width)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp_in = nn.Linear(width, 4 * width)
        self.mlp_out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        head_width = width // self.heads
        qkv = self.qkv(self.attention_norm(x)).view(batch, time, 3, self.heads, head_width)
        q, k, v = (qkv.select(2, i).transpose(1, 2) for i in range(3))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_width)
        causal = torch.ones(time, time, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, -math.inf)
        attended = torch.matmul(torch.softmax(scores, -1), v).transpose(1, 2).reshape(batch, time, width)
        h = x + self.attention_out(attended)
        return h + self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(h))))


class LanguageModel(nn.Module):
    def __init__(self, vocab=256, context=64, layers=4, width=128, heads=4):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, width)
        self.position_embedding = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.final_norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1])
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        return self.head(self.final_norm(self.blocks(x)))


def batch_loss(model: LanguageModel, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each sequence's next bytes, as tests/interop/model_loss.cpp."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
