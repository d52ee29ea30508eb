"""The scale ladder's report: `ladder.json`, `ladder.md` and two log-log plots.

The plots are `ladder_loss_vs_compute.png` and `ladder_advantage_vs_compute.png`.

`write_ladder_report(output_dir, settings, records)` computes every number with `hfzoo.study.ladder_fits` (compute
laws per family, Chinchilla's L(N, D) for the vanilla row, held-out checks, extrapolation to Narang et al. 2021's
compute, advantages over vanilla, the comparison with Tay et al. 2022) and writes them atomically, so an interrupted
ladder always leaves a complete (if partial) report. Compute is hfzoo's training FLOPs count, active FLOPs for
mixture-of-experts rows (`hfzoo.models.flops`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..outputs import replaced_atomically, write_json_atomic, write_text_atomic
from .ladder_fits import (
    CHINCHILLA_TOKENS_PER_PARAMETER,
    PAPER_EARLY_STEPS,
    PAPER_STEPS,
    fit_ladder,
)
from .protocol import BASELINE, FAMILIES
from .tables import _num, _si

__all__ = ["write_ladder_report"]

LOSS_PLOT = "ladder_loss_vs_compute.png"
ADVANTAGE_PLOT = "ladder_advantage_vs_compute.png"


def write_ladder_report(
    output_dir: Path, settings, records: list[dict], *, bootstrap_replicates: int = 1000, seed: int = 0
) -> dict:
    """Write `ladder.json` (all numbers), `ladder.md` (the readable report) and the two log-log plots.

    Args:
        output_dir: the study folder (created if absent).
        settings: the study's `StudySettings` (`family`, `variants`, `seeds`, `paper_table`, `ladder`).
        records: one record per (row, hidden size, seed) run of the ladder (`ladder_fits.ladder_runs`); a
            half-done ladder gives a report of what exists and names the missing cells.
        bootstrap_replicates: replicates of every bootstrap (1,000 or more for 95 % intervals).
        seed: the bootstrap's seed (the report is reproducible).

    Returns:
        The dict written to `ladder.json` (non-finite numbers as null).

    Raises:
        ValueError: `bootstrap_replicates` < 1 or a malformed record.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    numbers = fit_ladder(settings, records, bootstrap_replicates=bootstrap_replicates, seed=seed)
    fits = numbers.pop("_fits", None)
    numbers = _finite(numbers)
    write_json_atomic(output_dir / "ladder.json", numbers)
    write_text_atomic(output_dir / "ladder.md", "\n".join(_markdown(settings, numbers)) + "\n")
    _plot_losses(numbers, fits, output_dir / LOSS_PLOT)
    _plot_advantages(numbers, fits, output_dir / ADVANTAGE_PLOT)
    return numbers


def _finite(value):
    """`value` with NaN and infinities as None and tuples as lists (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _f(value, digits: int = 3) -> str:
    return _num(math.nan if value is None else value, digits)


def _c(value) -> str:
    """A compute in FLOPs: 2.86e+19."""
    return "–" if value is None or not math.isfinite(value) else f"{value:.3g}"


def _iv(interval, digits: int = 3, si: bool = False) -> str:
    if not interval or interval[0] is None or interval[1] is None:
        return "–"
    show = _c if si else (lambda v: _num(v, digits))
    return f"[{show(interval[0])}, {show(interval[1])}]"


def _markdown(settings, n: dict) -> list[str]:
    family = FAMILIES[settings.family]
    ladder = settings.ladder or {}
    cells, laws = n["cells"], n.get("compute_laws", {})
    level = f"{round(100 * n['confidence'])} %"
    lines = [
        f"# Scale ladder: {family.name}, {family.loss} loss",
        "",
        f"{n['runs']} runs in {len(cells)} cells (row x hidden size x train tokens); hidden sizes "
        f"{ladder.get('hidden_sizes', '–')}, token budgets {ladder.get('token_budgets', '–')}, seeds "
        f"{list(settings.seeds)}. Compute C is hfzoo's training FLOPs count (active FLOPs for expert rows); losses "
        f"are held-out losses in nats. Intervals: {level} percentile bootstrap, {n['bootstrap_replicates']:,} "
        "replicates, seeds resampled within each cell (seed noise only; not the error of the law's form).",
        "",
    ]
    if n["missing"] or n["failed"] or n["unfitted"]:
        lines += ["## Missing cells", ""]
        lines += [
            f"- {m['variant']}, hidden {m['hidden_size']}, {m['train_tokens']:,} tokens: seeds {m['missing_seeds']}"
            for m in n["missing"]
        ]
        lines += [
            f"- {m['variant']}, hidden {m['hidden_size']}, {m['train_tokens']:,} tokens, seed {m['seed']}: no finite "
            "final loss"
            for m in n["failed"]
        ]
        lines += [f"- {r}: {k} cell(s), not fitted (3 or more needed)" for r, k in n["unfitted"].items()]
        lines.append("")
    lines += [
        "## Measured losses",
        "",
        "| row | hidden | tokens | C (FLOPs) | loss (mean ± std) | seeds |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for c in cells:
        spread = f" ± {c['std']:.4f}" if c["std"] is not None else ""
        lines.append(
            f"| {c['variant']} | {c['hidden_size']} | {_si(c['train_tokens'])} | {_c(c['compute'])} | "
            f"{c['mean']:.4f}{spread} | {len(c['seeds'])} |"
        )
    lines.append("")
    if "error" in laws:
        return lines + [f"No compute law: {laws['error']}.", ""]
    lines += _law_lines(laws)
    lines += _holdout_lines(laws)
    lines += _chinchilla_lines(n.get("chinchilla", {}))
    lines += _extrapolation_lines(n.get("extrapolation", {}))
    lines += _advantage_lines(n.get("advantages", {}), laws.get("choice"))
    lines += _tay_lines(n.get("tay_2022", []))
    lines += [
        "## Figures",
        "",
        f"![loss against compute]({LOSS_PLOT})",
        "",
        f"![advantage over vanilla against compute]({ADVANTAGE_PLOT})",
        "",
    ]
    return lines


def _law_lines(laws: dict) -> list[str]:
    lines = [
        "## Compute laws",
        "",
        "L(C) = E + A_row C^-alpha, fitted to every row of the family at once (E shared), with one exponent for "
        "all rows and with one per row (Hoffmann et al. 2022 approach 3, Besiroglu et al. 2024's corrections). "
        "Both are fitted without each row's largest cell and predict it; the one with the smaller mean absolute "
        "error there is used below.",
        "",
    ]
    holdout = laws.get("holdout")
    if holdout:
        errors = holdout["mean_abs_error"]
        lines += [
            f"Held-out mean absolute error: shared exponent {_f(errors['shared'], 4)}, per-row exponents "
            f"{_f(errors['per_row'], 4)} nats: **{holdout['choice'].replace('_', '-')}** chosen.",
            "",
        ]
    else:
        lines += [f"No held-out choice ({laws.get('holdout_error')}); the shared exponent is used.", ""]
    for name, title in (("shared", "One shared exponent"), ("per_row", "One exponent per row")):
        if name not in laws:
            lines += [f"{title}: not fitted ({laws.get(f'{name}_error')}).", ""]
            continue
        fit = laws[name]
        lines += [
            f"{title}{'' if fit['converged'] else ' (L-BFGS-B did not report convergence)'}:",
            "",
            "| parameter | value | interval |",
            "|---|---:|---|",
        ]
        for p, v in fit["parameters"].items():
            big = p.startswith("A[")
            value = _c(v["value"]) if big else _f(v["value"], 4)
            lines.append(f"| {p} | {value} | {_iv(v['interval'], 4, big)} |")
        lines.append("")
    return lines


def _holdout_lines(laws: dict) -> list[str]:
    lines = [
        "## Held-out check",
        "",
        "Each row's largest cell predicted by the chosen law fitted without it; the error beside the cell's seed "
        "spread (standard deviation over seeds). |error / std| well above 1 means the law does not extrapolate "
        "even this far (reach: decades of compute beyond the largest cell fitted).",
        "",
        "| row | cell | C | measured | predicted | error | seed std | error / std | reach |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for h in laws.get("holdout_check", []):
        lines.append(
            f"| {h['variant']} | {h['hidden_size']}, {_si(h['train_tokens'])} | {_c(h['compute'])} | "
            f"{_f(h['measured'], 4)} | {_f(h.get('predicted'), 4)} | {_f(h.get('error'), 4)} | "
            f"{_f(h['seed_std'], 4)} | {_f(h.get('error_in_std'), 1)} | {_f(h.get('reach_decades'), 2)} |"
        )
    return lines + [""]


def _chinchilla_lines(ch: dict) -> list[str]:
    lines = ["## Vanilla: L(N, D)", ""]
    if "parameters" not in ch or not isinstance(ch["parameters"].get("E"), dict):
        return lines + [f"Not fitted: {ch.get('error', 'no result')}.", ""]
    p = ch["parameters"]
    lines += [
        f"L(N, D) = E + A / N^alpha + B / D^beta (Hoffmann et al. 2022, eq. 2) over the {BASELINE}'s sizes x "
        "budgets; N = total parameters (embeddings included, as Hoffmann et al. count them; Kaplan et al.'s "
        "non-embedding count shifts the optimum at small scale, where embeddings are a large share), D = training "
        "tokens. The compute-optimal allocation at the ladder's largest vanilla compute uses hfzoo's FLOPs per "
        "training token as a power law of N fitted over the ladder's sizes.",
        "",
        "| parameter | value | interval |",
        "|---|---:|---|",
    ]
    for name, value in p.items():
        big = name in ("A", "B", "N_opt", "D_opt")
        lines.append(
            f"| {name} | {_c(value['value']) if big else _f(value['value'], 4)} | {_iv(value['interval'], 4, big)} |"
        )
    ratio = p.get("tokens_per_parameter", {})
    lines += [
        "",
        f"At C = {_c(ch['compute'])} FLOPs the fit's compute-optimal model trains on {_f(ratio.get('value'), 1)} "
        f"tokens per parameter {_iv(ratio.get('interval'), 1)}; Hoffmann et al. 2022 find about "
        f"{CHINCHILLA_TOKENS_PER_PARAMETER:.0f} at 10^19 to 10^24 FLOPs.",
        "",
    ]
    return lines


def _extrapolation_lines(ex: dict) -> list[str]:
    lines = [
        "## Extrapolation to the paper's compute",
        "",
        f"Each row's loss at Narang et al. 2021's training compute: hfzoo's FLOPs count of the row on the paper-size "
        f"config (`narang-vanilla`, 512-token inputs, 32,128-token vocabulary) x {PAPER_STEPS:,} steps of 65,536 "
        f"tokens (final) or {PAPER_EARLY_STEPS:,} steps (early). The early prediction is a fully trained model at "
        "that compute, not the paper's mid-run loss at that step.",
        "",
    ]
    if "error" in ex:
        return lines + [f"Not computed: {ex['error']}.", ""]
    lines += [
        "| row | paper C | predicted final | interval | final - E | Table 1 final | predicted early | Table 1 early "
        "| decades |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r, e in ex["rows"].items():
        if "error" in e:
            lines.append(f"| {r} | – | – | – | – | – | – | – | – |")
            continue
        fin, early = e["final"], e["early"]
        lines.append(
            f"| {r} | {_c(fin['compute'])} | {_f(fin['predicted'])} | {_iv(fin['interval'])} | "
            f"{_c(fin['reducible'])} | {_f(fin.get('paper'))} | {_f(early['predicted'])} | {_f(early.get('paper'))} | "
            f"{_f(e['decades'], 1)} |"
        )
    lines.append("")
    reducible = [e["final"]["reducible"] for e in ex["rows"].values() if "final" in e]
    if reducible:
        lines += [
            f"At the paper's compute every row's predicted loss lies within {_c(max(reducible))} nats of the shared "
            "irreducible loss E (column final - E): the extrapolated ranking is the order of these terms, far "
            "smaller than any seed spread the ladder measures.",
            "",
        ]
    single = ex["rho_single_scale"]
    for key, label in (
        ("rho_final", "extrapolated final loss vs Table 1's final loss"),
        ("rho_early", "extrapolated early loss vs Table 1's early loss"),
    ):
        if key in ex:
            lines.append(
                f"- Spearman ρ, {label}: {_f(ex[key]['rho'], 2)} {_iv(ex[key]['interval'], 2)} "
                f"({ex[key]['rows']} rows; interval: the fit's bootstrap, the table fixed)"
            )
    lines.append(
        f"- Spearman ρ, losses measured at the largest cell (hidden {single['hidden_size']}, "
        f"{_si(single['train_tokens'])} tokens) vs Table 1's final loss: {_f(single['rho'], 2)} "
        f"{_iv(single['interval'], 2)} ({single['rows']} rows; interval: bootstrap over rows)"
    )
    decades = [e["decades"] for e in ex["rows"].values() if "decades" in e]
    if decades:
        lines += [
            "",
            f"The measured compute spans {_f(ex['measured_decades'], 1)} decades; the extrapolation reaches "
            f"{_f(min(decades), 1)} to {_f(max(decades), 1)} decades beyond each row's largest cell, against "
            "a held-out check of a fraction of a decade. Over that reach a small error in an exponent grows into "
            "a large error in the loss, and the intervals cover seed noise only: read the extrapolated losses "
            "and their ranking as what these laws imply, not as a prediction of the paper's numbers.",
        ]
    return lines + [""]


def _advantage_lines(adv: dict, choice) -> list[str]:
    lines = [
        "## Advantage over vanilla",
        "",
        "Advantage = vanilla's loss minus the row's (positive: the row is better). Measured: the mean losses of the "
        "same cell (same width, same tokens, as Table 1 compares rows); fitted: the chosen law at equal compute. "
        "Exponent difference alpha_row - alpha_vanilla and the sign flip (the compute where the two curves cross "
        "between the smallest measured compute and the paper's) come from the per-row-exponent law"
        + (
            ", which the held-out check did not choose: with one shared exponent the curves never cross"
            if choice == "shared"
            else ""
        )
        + ".",
        "",
    ]
    if "error" in adv:
        return lines + [f"Not computed: {adv['error']}.", ""]
    lines += [
        "| row | measured, largest cell | fitted, smallest C | fitted, paper C | alpha_row - alpha_vanilla | "
        "differs | sign flip at C | replicates with a flip |",
        "|---|---:|---|---|---|---|---|---:|",
    ]
    for r, e in adv["rows"].items():
        last = max(e["cells"], key=lambda c: c["compute"]) if e["cells"] else None
        small, paper = e.get("fitted_at_smallest", {}), e.get("fitted_at_paper", {})
        diff, cross = e.get("exponent_difference") or {}, e.get("crossing") or {}
        flip = _c(cross["compute"]) if cross.get("compute") else "none"
        lines.append(
            f"| {r} | {_f(last and last['measured'], 4)} | {_f(small.get('value'), 4)} {_iv(small.get('interval'), 4)}"
            f" | {_f(paper.get('value'), 4)} {_iv(paper.get('interval'), 4)} | {_f(diff.get('value'), 4)} "
            f"{_iv(diff.get('interval'), 4)} | {'yes' if diff.get('differs') else 'no' if diff else '–'} | {flip} "
            f"{_iv(cross.get('interval'), si=True)} | {_f(cross.get('defined_fraction'), 2)} |"
        )
    return lines + [""]


def _tay_lines(rows: list[dict]) -> list[str]:
    lines = [
        "## Comparison with Tay et al. 2022",
        "",
        'Tay et al. 2022 ("Scaling Laws vs Model Architectures: How does Inductive Bias Influence Scaling?", '
        "arXiv 2207.10551) scale ten architectures from 15M to 40B parameters as T5-style encoder-decoders. They "
        "report that the vanilla Transformer scales best of the ten even where it is not the best at one compute, "
        "that ALBERT (cross-layer sharing, our Block sharing) gets worse as it is scaled up, and that the best "
        "architecture changes with compute. Ours: the per-row law's exponent against vanilla's, and its sign flip.",
        "",
    ]
    if not rows:
        return lines + ["No fitted row besides vanilla is one of their architectures.", ""]
    lines += [
        "| row | Tay et al.'s architecture | their finding | ours: exponent vs vanilla | ours: sign flip |",
        "|---|---|---|---|---|",
    ]
    for t in rows:
        diff = t["exponent_difference"]
        if diff is None:
            ours = "–"
        elif not diff["differs"]:
            ours = f"not distinguishable ({_f(diff['value'], 3)} {_iv(diff['interval'], 3)})"
        else:
            ours = f"{'higher' if diff['value'] > 0 else 'lower'} ({_f(diff['value'], 3)} {_iv(diff['interval'], 3)})"
        flip = f"at {_c(t['crossing'])} FLOPs" if t["crossing"] else "none in range"
        lines.append(f"| {t['variant']} | {t['tay_architecture']} | {t['tay_finding']} | {ours} | {flip} |")
    return lines + [""]


def _colours(rows) -> dict:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(rows) <= 10 else "tab20"]
    return {r: cmap(i % cmap.N) for i, r in enumerate(rows)}


def _save(figure: Figure, path: Path, title: str) -> None:
    with replaced_atomically(path) as tmp:
        figure.savefig(tmp, format="png", dpi=100, metadata={"Software": "hfzoo", "Title": title})


def _plot_losses(n: dict, fits: dict | None, path: Path) -> None:
    """Every row's mean loss per cell (error bars: std over seeds) and its fitted law to the paper's compute."""
    figure = Figure(figsize=(9, 6), layout="constrained")
    axes = figure.subplots()
    rows = list(dict.fromkeys(c["variant"] for c in n["cells"]))
    colours = _colours(rows)
    for r in rows:
        own = [c for c in n["cells"] if c["variant"] == r]
        axes.errorbar(
            [c["compute"] for c in own],
            [c["mean"] for c in own],
            yerr=[c["std"] or 0.0 for c in own],
            fmt="o",
            ms=4,
            capsize=2,
            color=colours[r],
            label=r,
        )
    fit = fits and fits["fits"].get(fits["choice"])
    if fit is not None:
        low, high = fits["range"]
        grid = np.logspace(math.log10(low), math.log10(high), 200)
        for r in fit.rows:
            axes.plot(grid, fit.predict(grid, r), color=colours.get(r, "black"), lw=1)
        extrapolated = n.get("extrapolation", {}).get("rows", {})
        for r, e in extrapolated.items():
            if "final" in e:
                predicted = e["final"]["predicted"]
                low_end, high_end = e["final"]["interval"] or [predicted] * 2
                # a percentile interval need not contain the full-data estimate (a refit from the best start may
                # land a hair outside the replicates' range): the bar then ends at the estimate
                axes.errorbar(
                    [e["final"]["compute"]],
                    [predicted],
                    fmt="x",
                    color=colours.get(r),
                    yerr=[[max(0.0, predicted - low_end)], [max(0.0, high_end - predicted)]],
                )
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("training compute C (FLOPs)")
    axes.set_ylabel("held-out loss (nats)")
    axes.set_title(f"loss vs compute ({(fits or {}).get('choice', 'no')} exponent law; x: paper compute)")
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize=7)
    _save(figure, path, "ladder: loss against compute")


def _plot_advantages(n: dict, fits: dict | None, path: Path) -> None:
    """Each row's advantage over vanilla: measured per cell (points), fitted at equal compute (lines)."""
    figure = Figure(figsize=(9, 6), layout="constrained")
    axes = figure.subplots()
    advantages = n.get("advantages", {}).get("rows", {})
    colours = _colours(list(advantages))
    fit = fits and fits["fits"].get(fits["choice"])
    for r, e in advantages.items():
        axes.plot(
            [c["compute"] for c in e["cells"]],
            [c["measured"] for c in e["cells"]],
            "o",
            ms=4,
            color=colours[r],
            label=r,
        )
        if fit is not None:
            low, high = fits["range"]
            grid = np.logspace(math.log10(low), math.log10(high), 200)
            axes.plot(grid, fit.predict(grid, BASELINE) - fit.predict(grid, r), color=colours[r], lw=1)
    axes.axhline(0.0, color="black", lw=0.8)
    axes.set_xscale("log")
    axes.set_xlabel("training compute C (FLOPs)")
    axes.set_ylabel("vanilla loss - row loss (nats)")
    axes.set_title("advantage over vanilla (points: same cell; lines: fitted, equal compute)")
    axes.grid(alpha=0.3, which="both")
    if advantages:
        axes.legend(fontsize=7)
    else:
        axes.text(0.5, 0.5, "no advantage: vanilla or a second row not fitted", ha="center", transform=axes.transAxes)
    _save(figure, path, "ladder: advantage over vanilla against compute")
