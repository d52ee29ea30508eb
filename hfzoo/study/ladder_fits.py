"""The scale ladder's numbers: its cells, the compute-law and Chinchilla fits, held-out checks and extrapolations.

A ladder study (study-file key `ladder`) trains every row at several hidden sizes and seeds, each run giving the
final loss at several token budgets (short cooldowns branched from one warmup-stable-decay run). A *cell* is one
(row, hidden size, train tokens); its runs differ by seed. `fit_ladder` turns the runs' records into every figure
of the ladder report (`hfzoo.study.ladder_report`) with the fitting library `hfzoo.study.scaling`:

1. per family, L(C) = E + A_row * C^-alpha with one shared exponent and with one exponent per row, chosen by the
   error at each row's held-out largest cell (`select_by_holdout`), with bootstrap intervals (`bootstrap`: seeds
   resampled within each cell);
2. for the vanilla row, Chinchilla's L(N, D) = E + A / N^a + B / D^b (Hoffmann et al. 2022, eq. 2) over its size
   x budget grid and the compute-optimal tokens per parameter at the ladder's largest compute;
3. the held-out prediction error of each row's largest cell beside that cell's seed spread;
4. each row's loss extrapolated to Narang et al. 2021's training compute and the Spearman rho of that ranking
   against the paper's Table 1, beside the rho of the losses measured at the ladder's largest cell;
5. each row's advantage over vanilla against compute, where its sign flips, and whether its exponent differs;
6. the comparison with Tay et al. 2022 (`TAY_2022`).

Compute C is hfzoo's training FLOPs count (`hfzoo.models.flops.count_training_flops`, the runs' `total_flops`):
6 FLOPs per matrix-product weight a token passes plus the attention work. For mixture-of-experts rows it counts
the *active* FLOPs: the router and the `num_experts_per_tok` experts a token is sent to, not every expert.

The budgets of one seed share their stable phase, so they are not independent; the bootstrap resamples seeds within
each cell independently and so ignores that correlation. With three seeds per cell it also sees only two thirds
of their variance (`scaling.bootstrap`): the intervals reflect seed noise at best, never a wrong functional form.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..models.flops import count_training_flops
from ..models.narang import load_paper_table
from .configs import build_variant_config, planned_tokenizer_fields, target_length
from .protocol import BASELINE
from .scaling import bootstrap, fit_chinchilla, fit_compute_law, ranking_spearman, select_by_holdout
from .summary import spearman_with_interval

#: Narang et al. 2021 (§2): T5-base-sized models (223M parameters, the `narang-vanilla` preset) trained for
#: 524,288 steps of 65,536 tokens (512-token inputs, T5's 32,128-entry vocabulary); the early loss at 65,536 steps.
PAPER_PRESET = "narang-vanilla"
PAPER_STEPS = 524_288
PAPER_EARLY_STEPS = 65_536
PAPER_BATCH_TOKENS = 65_536
PAPER_BLOCK_SIZE = 512
PAPER_VOCAB_SIZE = 32_128
#: Compute-optimal training tokens per parameter of Hoffmann et al. 2022 (Table 3: e.g. 70B parameters, 1.4T tokens).
CHINCHILLA_TOKENS_PER_PARAMETER = 20.0
#: Tay et al. 2022 ("Scaling Laws vs Model Architectures: How does Inductive Bias Influence Scaling?", arXiv
#: 2207.10551, §1 and §5): what they report for the architectures our rows share with them. Over all ten
#: architectures "the vanilla Transformer has the best scaling behavior, even if its absolute performance at each
#: compute region is not the greatest", and "the best performing model can fluctuate at different scales".
TAY_ARCHITECTURES = {
    "Block sharing": "ALBERT",
    "+ Factorized embeddings": "ALBERT",
    "+ Factorized & shared embeddings": "ALBERT",
    "Switch Transformer": "Switch Transformer",
    "Funnel Transformer": "Funnel Transformer",
    "Lightweight convolution": "Lightweight convolutions",
    "Dynamic convolution": "Dynamic convolutions",
    "GLU": "GLU",
    "GeGLU": "GLU",
    "ReGLU": "GLU",
    "SwiGLU": "GLU",
    "LiGLU": "GLU",
    "Mixture of softmaxes": "Mixture of Softmaxes",
    "Evolved Transformer": "Evolved Transformer",
    "Universal Transformer": "Universal Transformer",
}
TAY_FINDINGS = {
    "ALBERT": "scales negatively: gets worse as the model is scaled up (vanilla scales best)",
    "default": "scales less well than vanilla (vanilla's scaling is the best of the ten architectures)",
}
_BUDGET_KEYS = ("train_tokens", "total_flops", "final_loss")


def ladder_runs(records: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """One entry per (record, budget): the runs the fits use, and the budgets without a finite final loss.

    Args:
        records: the ladder's run records (`variant`, `seed`, `hidden_size`, `parameters`, optional
            `non_embedding_parameters`, `budgets`: [{`train_tokens`, `total_flops` (FLOPs), `final_loss` (nats)}]).

    Returns:
        (runs, failed): runs as {`variant`, `seed`, `hidden_size`, `train_tokens`, `compute`, `loss`,
        `parameters`, `non_embedding_parameters`}; failed as {`variant`, `seed`, `hidden_size`, `train_tokens`}.

    Raises:
        ValueError: a record or budget misses a key, or a budget's tokens or FLOPs are not positive.
    """
    runs, failed = [], []
    for i, record in enumerate(records):
        missing = [k for k in ("variant", "seed", "hidden_size", "parameters", "budgets") if k not in record]
        if missing:
            raise ValueError(f"ladder record {i}: missing keys {missing}; expected a run record of the scale ladder")
        where = f"ladder record {i} ({record['variant']!r}, hidden {record['hidden_size']}, seed {record['seed']})"
        for budget in record["budgets"]:
            absent = [k for k in _BUDGET_KEYS if k not in budget]
            if absent:
                raise ValueError(f"{where}: a budget misses keys {absent}")
            tokens, flops, loss = (budget[k] for k in _BUDGET_KEYS)
            if not (tokens and tokens > 0 and flops and flops > 0 and math.isfinite(flops)):
                raise ValueError(f"{where}: train_tokens={tokens!r}, total_flops={flops!r}; expected positive numbers")
            key = {"variant": record["variant"], "seed": record["seed"], "hidden_size": record["hidden_size"]}
            if loss is None or not math.isfinite(loss) or loss <= 0:
                failed.append({**key, "train_tokens": tokens})
                continue
            runs.append(
                {
                    **key,
                    "train_tokens": tokens,
                    "compute": float(flops),
                    "loss": float(loss),
                    "parameters": record["parameters"],
                    "non_embedding_parameters": record.get("non_embedding_parameters"),
                }
            )
    return runs, failed


def ladder_cells(runs: list[dict]) -> dict[tuple, dict]:
    """The runs grouped into cells, in order of first appearance.

    Returns:
        (row, hidden size, train tokens) -> {`compute` (mean FLOPs), `mean`, `std` (nats; ddof 1, NaN for one
        seed), `seeds`, `losses`, `parameters`}.
    """
    cells: dict[tuple, dict] = {}
    for run in runs:
        cell = cells.setdefault((run["variant"], run["hidden_size"], run["train_tokens"]), {"runs": []})
        cell["runs"].append(run)
    for cell in cells.values():
        losses = [r["loss"] for r in cell["runs"]]
        cell.update(
            compute=float(np.mean([r["compute"] for r in cell["runs"]])),
            mean=float(np.mean(losses)),
            std=float(np.std(losses, ddof=1)) if len(losses) > 1 else math.nan,
            seeds=[r["seed"] for r in cell["runs"]],
            losses=losses,
            parameters=cell["runs"][0]["parameters"],
        )
        del cell["runs"]
    return cells


def missing_cells(settings, runs: list[dict]) -> list[dict]:
    """The planned cells with seeds not finished, planned from `settings.ladder` (`hidden_sizes`, `token_budgets`).

    Returns:
        [{`variant`, `hidden_size`, `train_tokens`, `missing_seeds`}] in plan order (a budget without a finite loss
        counts as missing).
    """
    ladder = settings.ladder or {}
    done = {(r["variant"], r["hidden_size"], r["train_tokens"], r["seed"]) for r in runs}
    out = []
    for variant in settings.variants:
        for hidden in ladder.get("hidden_sizes", []):
            for tokens in ladder.get("token_budgets", []):
                seeds = [s for s in settings.seeds if (variant, hidden, tokens, s) not in done]
                if seeds:
                    out.append(
                        {"variant": variant, "hidden_size": hidden, "train_tokens": tokens, "missing_seeds": seeds}
                    )
    return out


def paper_compute(settings, rows) -> dict[str, dict]:
    """Each row's training compute at the paper's scale, counted by hfzoo on the paper-size config.

    The config is the `narang-vanilla` preset (T5-base size) without the study's `config_overrides`, the row
    resolved against it (`build_variant_config`) in the study's family, with a 32,128-token vocabulary and
    512-token inputs (an encoder-decoder's targets: `target_length` at the study's noise settings). Compute is
    `count_training_flops(...).total` per sequence x 128 sequences per step x 524,288 steps (the early loss: x 65,536
    steps), as the study counts its own runs.

    Returns:
        row -> {`flops_per_sequence`, `final_compute`, `early_compute`} (FLOPs), or {`error`: why not} for a row
        without a paper-size form.
    """
    paper = dataclasses.replace(
        settings,
        config_name=PAPER_PRESET,
        config_overrides={},
        block_size=PAPER_BLOCK_SIZE,
        train_batch_tokens=PAPER_BATCH_TOKENS,
    )
    fields = planned_tokenizer_fields(settings.family, PAPER_VOCAB_SIZE)
    sequences = PAPER_BATCH_TOKENS // PAPER_BLOCK_SIZE
    out = {}
    for row in rows:
        try:
            config = build_variant_config(paper, row, fields)
        except ValueError as error:
            out[row] = {"error": str(error)}
            continue
        per_sequence = count_training_flops(config, PAPER_BLOCK_SIZE, target_length(paper)).total
        out[row] = {
            "flops_per_sequence": per_sequence,
            "final_compute": per_sequence * sequences * PAPER_STEPS,
            "early_compute": per_sequence * sequences * PAPER_EARLY_STEPS,
        }
    return out


def _interval(values: np.ndarray, confidence: float) -> list[float] | None:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if not len(values):
        return None
    tail = 100 * (1 - confidence) / 2
    return [float(v) for v in np.percentile(values, [tail, 100 - tail])]


def _replicate_loss(result, fit, row, compute: float) -> np.ndarray:
    """(replicates,) the loss of `row` at `compute` FLOPs under each bootstrap replicate's parameters."""
    alpha = result.replicates["alpha" if fit.shared_exponent else f"alpha[{row}]"]
    return result.replicates["E"] + result.replicates[f"A[{row}]"] * compute**-alpha


def _try(function, *args, **kwargs):
    """(value, None) or (None, the ValueError / RuntimeError message) of a fit that the data may not support."""
    try:
        return function(*args, **kwargs), None
    except (ValueError, RuntimeError) as error:
        return None, str(error)


def _law_parameters(fit, result, confidence: float) -> dict:
    return {
        "converged": fit.converged,
        "parameters": {
            name: {"value": value, "interval": _interval(result.replicates[name], confidence)}
            for name, value in fit.parameters().items()
        },
        "bootstrap_failed": result.n_failed,
    }


def _compute_laws(fitted, cells, paper, replicates, rng_seed, confidence) -> tuple[dict, dict]:
    """Sections 1 and 3 (fits, choice, held-out check) and what sections 4 and 5 need (fits and bootstraps)."""
    rows = list(dict.fromkeys(r for r, _, _ in fitted))
    compute, loss, row, seed = [], [], [], []
    for (r, *_), c in fitted.items():
        for value, s in zip(c["losses"], c["seeds"]):
            compute.append(c["compute"]), loss.append(value), row.append(r), seed.append(s)
    compute = np.array(compute)
    scale = compute  # a cell's runs share its compute: each row's largest-compute cell is held out
    data = (compute, np.array(loss), row, seed)
    section: dict[str, Any] = {"rows": rows}
    selection, error = _try(select_by_holdout, *data, scale=scale, on_nonconvergence="flag")
    if selection is None:
        section["holdout_error"] = error
        choice = "shared"
    else:
        choice = selection.choice
        section["holdout"] = {"choice": choice, "mean_abs_error": selection.errors}
    section["choice"] = choice
    targets = {r: paper[r]["final_compute"] for r in rows if "final_compute" in paper.get(r, {})}
    low = float(compute.min())
    high = max([float(compute.max()), *targets.values()])
    fits, boots = {}, {}
    for name, shared in (("shared", True), ("per_row", False)):
        fit, error = _try(fit_compute_law, *data, shared_exponent=shared, scale=scale, on_nonconvergence="flag")
        if fit is None:
            section[f"{name}_error"] = error
            continue
        reference = BASELINE if BASELINE in rows and not shared else None
        fits[name] = fit
        boots[name] = bootstrap(
            fit,
            n_resamples=replicates,
            confidence=confidence,
            rng=rng_seed,
            reference_row=reference,
            compute_range=(low, high) if reference else None,
        )
        section[name] = _law_parameters(fit, boots[name], confidence)
    if choice not in fits and fits:
        choice = section["choice"] = next(iter(fits))
    section["holdout_check"] = _holdout_check(selection, cells, rows, choice)
    return section, {"fits": fits, "boots": boots, "choice": choice, "range": (low, high), "targets": targets}


def _holdout_check(selection, cells, rows, choice) -> list[dict]:
    """Per row: its largest cell, measured mean and seed spread, and both variants' prediction errors there."""
    out = []
    for r in rows:
        own = {k: c for k, c in cells.items() if k[0] == r}
        key = max(own, key=lambda k: own[k]["compute"])
        cell = own[key]
        entry = {
            "variant": r,
            "hidden_size": key[1],
            "train_tokens": key[2],
            "compute": cell["compute"],
            "measured": cell["mean"],
            "seed_std": cell["std"],
            "seeds": len(cell["seeds"]),
        }
        if selection is not None:
            kept = [c["compute"] for k, c in own.items() if k != key]
            entry["reach_decades"] = math.log10(cell["compute"] / max(kept))
            entry["errors"] = {name: selection.cell_errors[name][r] for name in selection.cell_errors}
            entry["error"] = selection.cell_errors[choice][r]
            entry["predicted"] = cell["mean"] + entry["error"]
            spread = cell["std"]
            entry["error_in_std"] = entry["error"] / spread if math.isfinite(spread) and spread > 0 else math.nan
        out.append(entry)
    return out


def _flops_per_training_token(cells) -> tuple[float, float] | None:
    """(intercept, slope) of log(C / D) against log N over the vanilla sizes: hfzoo's FLOPs per training token."""
    sizes = {}
    for (r, _, tokens), c in cells.items():
        if r == BASELINE:
            sizes.setdefault(c["parameters"], c["compute"] / tokens)
    if len(sizes) < 2:
        return None
    slope, intercept = np.polyfit(np.log(list(sizes)), np.log(list(sizes.values())), 1)
    return float(intercept), float(slope)


def _chinchilla(cells, replicates, rng_seed, confidence) -> dict:
    """Section 2: L(N, D) of the vanilla row, N its total parameters, and the compute-optimal allocation."""
    own = {k: c for k, c in cells.items() if k[0] == BASELINE}
    if not own:
        return {"error": f"no {BASELINE!r} runs"}
    n, d, loss, seed = [], [], [], []
    for (_, _, tokens), c in own.items():
        for value, s in zip(c["losses"], c["seeds"]):
            n.append(c["parameters"]), d.append(tokens), loss.append(value), seed.append(s)
    fit, error = _try(fit_chinchilla, n, d, loss, seed, on_nonconvergence="flag")
    if fit is None:
        return {"error": error}
    line = _flops_per_training_token(cells)
    flops = 6.0 if line is None else (lambda size: math.exp(line[0] + line[1] * math.log(size)))
    target = max(c["compute"] for c in own.values())
    result, error = _try(
        bootstrap,
        fit,
        n_resamples=replicates,
        confidence=confidence,
        rng=rng_seed,
        target_compute=target,
        flops_per_token=flops,
    )
    out = {"N": "total parameters", "converged": fit.converged, "compute": target, "flops_per_token_fit": line}
    if result is None:
        return {**out, "error": error, "parameters": fit.parameters()}
    out["parameters"] = {
        name: {"value": value, "interval": result.intervals[name]} for name, value in result.estimates.items()
    }
    return out


def _extrapolation(laws, cells, paper, table, confidence) -> dict:
    """Section 4: each row's loss at the paper's compute (final and early), rho against Table 1, and its reach."""
    choice, fits, boots = laws["choice"], laws["fits"], laws["boots"]
    if choice not in fits:
        return {"error": "no compute law was fitted"}
    fit, result = fits[choice], boots[choice]
    rows, out = fit.rows, {"rows": {}}
    largest = max(c["compute"] for c in cells.values())
    for r in rows:
        if "final_compute" not in paper.get(r, {}):
            out["rows"][r] = {"error": paper.get(r, {}).get("error", "no paper-size config")}
            continue
        entry = {
            "decades": math.log10(paper[r]["final_compute"] / max(c["compute"] for k, c in cells.items() if k[0] == r))
        }
        for stage in ("final", "early"):
            c = paper[r][f"{stage}_compute"]
            entry[stage] = {
                "compute": c,
                "predicted": float(fit.predict(c, r)),
                "reducible": float(fit.predict(c, r)) - fit.parameters()["E"],  # the row's term above the shared E
                "interval": _interval(_replicate_loss(result, fit, r, c), confidence),
            }
            if r in table:
                entry[stage]["paper"] = getattr(table[r], f"{stage}_loss")
        out["rows"][r] = entry
    common = [r for r in rows if r in table and "final" in out["rows"][r]]
    if len(common) >= 3:
        for stage in ("final", "early"):
            estimates = {f"prediction[{r}]": out["rows"][r][stage]["predicted"] for r in common}
            samples = {
                f"prediction[{r}]": _replicate_loss(result, fit, r, paper[r][f"{stage}_compute"]) for r in common
            }
            shaped = dataclasses.replace(result, estimates=estimates, replicates=samples)
            rho, low, high = ranking_spearman(shaped, {r: getattr(table[r], f"{stage}_loss") for r in common})
            out[f"rho_{stage}"] = {"rho": rho, "interval": [low, high], "rows": len(common)}
    top = max((k[1], k[2]) for k in cells)
    at_top = {k[0]: c["mean"] for k, c in cells.items() if (k[1], k[2]) == top and k[0] in table}
    rho, low, high = spearman_with_interval(list(at_top.values()), [table[r].final_loss for r in at_top])
    out["rho_single_scale"] = {
        "hidden_size": top[0],
        "train_tokens": top[1],
        "rho": rho,
        "interval": [low, high],
        "rows": len(at_top),
    }
    computes = [c["compute"] for c in cells.values()]
    out["measured_decades"] = math.log10(max(computes) / min(computes))
    out["largest_measured_compute"] = largest
    return out


def _advantages(laws, cells, confidence) -> dict:
    """Section 5: each row's advantage over vanilla (measured per cell, fitted), its sign flip and exponent."""
    fits, boots, choice = laws["fits"], laws["boots"], laws["choice"]
    if choice not in fits or BASELINE not in fits[choice].rows:
        return {"error": f"no compute law with the {BASELINE!r} row"}
    fit, result = fits[choice], boots[choice]
    per_row, per_boot = fits.get("per_row"), boots.get("per_row")
    low, high = laws["range"]
    out = {"range": [low, high], "rows": {}}
    for r in fit.rows:
        if r == BASELINE:
            continue
        measured = []
        for (row, hidden, tokens), c in cells.items():
            base = cells.get((BASELINE, hidden, tokens))
            if row == r and base is not None:
                measured.append(
                    {
                        "hidden_size": hidden,
                        "train_tokens": tokens,
                        "compute": c["compute"],
                        "measured": base["mean"] - c["mean"],
                        "fitted": float(fit.predict(c["compute"], BASELINE) - fit.predict(c["compute"], r)),
                    }
                )
        entry: dict[str, Any] = {"cells": measured}
        for label, c in (("smallest", low), ("paper", laws["targets"].get(r))):
            if c is not None:
                samples = _replicate_loss(result, fit, BASELINE, c) - _replicate_loss(result, fit, r, c)
                entry[f"fitted_at_{label}"] = {
                    "compute": c,
                    "value": float(fit.predict(c, BASELINE) - fit.predict(c, r)),
                    "interval": _interval(samples, confidence),
                }
        if per_row is not None and r in per_row.rows:
            difference = per_boot.replicates[f"alpha[{r}]"] - per_boot.replicates[f"alpha[{BASELINE}]"]
            interval = _interval(difference, confidence)
            entry["exponent_difference"] = {
                "value": per_row.alpha[r] - per_row.alpha[BASELINE],
                "interval": interval,
                "differs": interval is not None and (interval[0] > 0 or interval[1] < 0),
            }
            name = f"crossing[{r}]"
            entry["crossing"] = {
                "compute": per_boot.estimates.get(name),
                "interval": per_boot.intervals.get(name),
                "defined_fraction": per_boot.defined_fraction.get(name),
            }
        out["rows"][r] = entry
    return out


def _tay(advantages) -> list[dict]:
    """Section 6: our rows that Tay et al. 2022 also scaled, their finding and ours."""
    out = []
    for r, entry in advantages.get("rows", {}).items():
        if r not in TAY_ARCHITECTURES:
            continue
        architecture = TAY_ARCHITECTURES[r]
        ours = entry.get("exponent_difference")
        crossing = entry.get("crossing") or {}
        out.append(
            {
                "variant": r,
                "tay_architecture": architecture,
                "tay_finding": TAY_FINDINGS.get(architecture, TAY_FINDINGS["default"]),
                "exponent_difference": ours,
                "crossing": crossing.get("compute"),
            }
        )
    return out


def fit_ladder(
    settings,
    records: list[dict[str, Any]],
    *,
    bootstrap_replicates: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Every number of the ladder report, from the runs' records (see the module docstring for the sections).

    Args:
        settings: the study's `StudySettings` (`family`, `variants`, `seeds`, `paper_table`, `ladder`).
        records: the ladder's run records (`ladder_runs`), possibly a half-done ladder.
        bootstrap_replicates: bootstrap replicates per fit (>= 1).
        seed: the bootstrap's random seed (the report is reproducible).
        confidence: the intervals' level.

    Returns:
        A JSON-ready dict: `cells`, `missing`, `failed`, `paper_compute`, `compute_laws`, `chinchilla`,
        `extrapolation`, `advantages`, `tay_2022`, `unfitted` (rows with fewer than 3 cells), and the options.

    Raises:
        ValueError: `bootstrap_replicates` < 1, or a malformed record (`ladder_runs`).
    """
    if bootstrap_replicates < 1:
        raise ValueError(f"bootstrap_replicates={bootstrap_replicates}: expected at least 1")
    runs, failed = ladder_runs(records)
    cells = ladder_cells(runs)
    counts = {}
    for r, *_ in cells:
        counts[r] = counts.get(r, 0) + 1
    fitted = {k: c for k, c in cells.items() if counts[k[0]] >= 3}
    rows = list(dict.fromkeys(k[0] for k in fitted))
    table = load_paper_table(settings.paper_table) if settings.paper_table else {}
    paper = paper_compute(settings, rows)
    out: dict[str, Any] = {
        "family": settings.family,
        "bootstrap_replicates": bootstrap_replicates,
        "confidence": confidence,
        "seed": seed,
        "runs": len(runs),
        "cells": [{"variant": k[0], "hidden_size": k[1], "train_tokens": k[2], **c} for k, c in cells.items()],
        "missing": missing_cells(settings, runs),
        "failed": failed,
        "unfitted": {r: n for r, n in counts.items() if n < 3},
        "paper_compute": paper,
    }
    if len(rows) < 1:
        out["compute_laws"] = {"error": "no row has 3 or more cells"}
        return out
    out["compute_laws"], laws = _compute_laws(fitted, cells, paper, bootstrap_replicates, seed, confidence)
    out["chinchilla"] = _chinchilla(fitted, bootstrap_replicates, seed, confidence)
    out["extrapolation"] = _extrapolation(laws, fitted, paper, table, confidence)
    out["advantages"] = _advantages(laws, fitted, confidence)
    out["tay_2022"] = _tay(out["advantages"])
    out["_fits"] = laws  # the fit objects, for the plots (not written to JSON)
    return out
