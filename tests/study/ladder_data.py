"""Synthetic scale-ladder records from a known law L = E + A_row * C^-alpha_row (+ Gaussian noise)."""

from __future__ import annotations

import dataclasses

import numpy as np

from hfzoo.study.settings import load_settings

E_TRUE = 1.8
HIDDEN_SIZES = (64, 96, 128)
TOKEN_BUDGETS = (204_800, 409_600, 819_200)
#: Each row's (FLOPs-per-token factor relative to vanilla, A, alpha).
LAWS = {
    "Vanilla Transformer": (1.0, 16_000.0, 0.3),
    "SwiGLU": (1.0, 14_500.0, 0.3),
    "Block sharing": (1.0, 18_000.0, 0.3),
    "Funnel Transformer": (0.6, 17_000.0, 0.3),
}


def parameters(hidden: int) -> int:
    """A small encoder-decoder's parameters at width `hidden` (8 layers, 4,096-token vocabulary)."""
    return 96 * hidden * hidden + 4096 * hidden


def loss_at(law, compute):
    _, a, alpha = law
    return E_TRUE + a * np.asarray(compute, dtype=float) ** -alpha


def ladder_records(
    laws=LAWS, hidden_sizes=HIDDEN_SIZES, budgets=TOKEN_BUDGETS, seeds=(0, 1, 2), noise=0.003, data_seed=0, skip=()
):
    """One record per (row, hidden size, seed), each with every budget; `skip`: (row, hidden, tokens) left out."""
    rng = np.random.default_rng(data_seed)
    records = []
    for row, law in laws.items():
        for hidden in hidden_sizes:
            per_token = 6.0 * parameters(hidden) * law[0]
            for seed in seeds:
                chosen = [t for t in budgets if (row, hidden, t) not in skip]
                if not chosen:
                    continue
                records.append(
                    {
                        "variant": row,
                        "seed": seed,
                        "hidden_size": hidden,
                        "parameters": parameters(hidden),
                        "non_embedding_parameters": 96 * hidden * hidden,
                        "flops_per_token": per_token,
                        "flops_per_step": per_token * 2048,
                        "budgets": [
                            {
                                "train_steps": t // 2048,
                                "train_tokens": t,
                                "total_flops": per_token * t,
                                "final_loss": float(loss_at(law, per_token * t) + noise * rng.standard_normal()),
                                "branched_from_step": None if t == max(budgets) else int(0.8 * t // 2048),
                            }
                            for t in chosen
                        ],
                        "timing": {},
                        "mixed_precision": "no",
                        "host_capability": "AVX2",
                    }
                )
    return records


def ladder_settings(paper_table, laws=LAWS, seeds=(0, 1, 2), hidden_sizes=HIDDEN_SIZES, budgets=TOKEN_BUDGETS):
    """The default study's settings with these rows, seeds and ladder."""
    settings = load_settings("recipes/studies/narang_small.yaml")
    ladder = {"hidden_sizes": list(hidden_sizes), "token_budgets": list(budgets), "cooldown_fraction": 0.2}
    return dataclasses.replace(
        settings, variants=list(laws), seeds=list(seeds), paper_table=str(paper_table), ladder=ladder
    )
