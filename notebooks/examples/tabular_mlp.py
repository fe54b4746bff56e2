"""A tabular model as a reader might bring it: churn prediction from a customer table.

Not an image model: each sample is a row of 40 numeric columns plus 3 categorical columns
(country, plan, device), embedded and concatenated. Written the way many projects write
their model (a config dict, embeddings, residual MLP blocks with LayerNorm and dropout),
with no knowledge of the course. Tune it with

    python -m helpers.tune --model notebooks/examples/tabular_mlp.py:build --budget 90 --out /tmp/tuneout

``build()`` returns (model, inputs, targets, loss_fn, make_optimizer); inputs is a tuple
(numeric, categorical), so the tuner calls ``model(numeric, categorical)``.
"""

import torch
from torch import nn

CONFIG = {
    "numeric": 40,
    "categories": [30, 4, 6],   # countries, plans, devices
    "embedding": 8,
    "hidden": 128,
    "blocks": 3,
    "dropout": 0.1,
    "classes": 2,               # churns / stays
    "batch": 256,
}


class ResidualBlock(nn.Module):
    def __init__(self, width, dropout):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Dropout(dropout),
                                nn.Linear(2 * width, width))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class ChurnNet(nn.Module):
    def __init__(self, cfg=CONFIG):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(n, cfg["embedding"]) for n in cfg["categories"])
        width_in = cfg["numeric"] + cfg["embedding"] * len(cfg["categories"])
        self.stem = nn.Linear(width_in, cfg["hidden"])
        self.blocks = nn.Sequential(*(ResidualBlock(cfg["hidden"], cfg["dropout"]) for _ in range(cfg["blocks"])))
        self.head = nn.Sequential(nn.LayerNorm(cfg["hidden"]), nn.Linear(cfg["hidden"], cfg["classes"]))

    def forward(self, numeric, categorical):
        embedded = [emb(categorical[:, i]) for i, emb in enumerate(self.embeddings)]
        x = self.stem(torch.cat([numeric, *embedded], dim=1))
        return self.head(self.blocks(x))


def fake_batch(cfg=CONFIG, seed=0):
    """A synthetic batch with a learnable rule (no data download needed)."""
    g = torch.Generator().manual_seed(seed)
    numeric = torch.randn(cfg["batch"], cfg["numeric"], generator=g)
    categorical = torch.stack([torch.randint(0, n, (cfg["batch"],), generator=g) for n in cfg["categories"]], dim=1)
    churn = (numeric[:, :5].sum(dim=1) + 0.5 * (categorical[:, 1] == 0).float() > 0.5).long()
    return numeric, categorical, churn


def build():
    model = ChurnNet()
    numeric, categorical, churn = fake_batch()
    loss_fn = nn.CrossEntropyLoss()
    make_optimizer = lambda params: torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01)
    return model, (numeric, categorical), churn, loss_fn, make_optimizer
