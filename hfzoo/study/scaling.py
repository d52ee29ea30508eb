"""Scaling laws for the study's scale ladder: loss against compute per row, Chinchilla's L(N, D), bootstrap intervals.

Each row (a Transformer modification) is trained at several model sizes and token budgets, several seeds per
(row, scale) cell. `fit_compute_law` fits L(C) = E + A_row * C^-alpha_row per family against training compute C
(FLOPs), with one exponent for all rows or one per row (E shared); `select_by_holdout` chooses between the two by
the error at each row's largest scale; `fit_chinchilla` fits L(N, D) = E + A / N^alpha + B / D^beta and gives the
compute-optimal allocation; `bootstrap` gives percentile intervals, resampling seeds within cells;
`ranking_spearman` compares the extrapolated ranking of rows with a reference one.

The method is Hoffmann et al. 2022 ("Training Compute-Optimal Large Language Models", arXiv 2203.15556, approach 3,
App. D.2): the Huber loss (delta = 1e-3) of log L_pred - log L_obs, log L_pred a log-sum-exp of terms linear in the
parameters (e = log E, a = log A, ...), minimised by L-BFGS-B (`scipy.optimize.minimize`) from a grid of starts,
the best end point kept; with the corrections of Besiroglu et al. 2024 ("Chinchilla Scaling: A replication
attempt", arXiv 2404.10102): the loss is summed over the runs (Hoffmann et al.'s optimiser "stopped before
convergence due to a poor choice of loss scale"), tolerances are tight, the best start's convergence is checked
(`FitNotConverged`, or `converged=False`) and parameters are not rounded. log C (log N, log D) is centred on its
mean inside, which leaves the model and optimum unchanged (a = a_centred + alpha * mean log C).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from scipy import optimize, stats

#: Huber loss threshold on log-space residuals (Hoffmann et al. 2022, App. D.2).
HUBER_DELTA = 1e-3

#: L-BFGS-B settings: `ftol` is relative to max(|f|, 1) and the loss is far below 1 near the optimum, so scipy's
#: default (2.2e-9) would stop early; these let it run to the optimum.
_OPTIONS = {"ftol": 1e-15, "gtol": 1e-11, "maxiter": 5000, "maxls": 50}


class FitNotConverged(RuntimeError):
    """L-BFGS-B did not report convergence from the best starting point (with `on_nonconvergence="raise"`)."""


@dataclasses.dataclass(frozen=True)
class _Problem:
    """log L_pred = logsumexp_k (mats[k] @ theta), mats (terms, runs, parameters); cells (runs,); starts (s, p)."""

    mats: np.ndarray
    log_loss: np.ndarray
    cells: np.ndarray
    starts: np.ndarray
    bounds: tuple
    delta: float
    maxiter: int


def _objective(theta: np.ndarray, mats: np.ndarray, log_loss: np.ndarray, delta: float) -> tuple[float, np.ndarray]:
    """Summed Huber loss of log-space residuals and its gradient with respect to theta."""
    terms = mats @ theta  # (K, n)
    top = terms.max(axis=0)
    weights = np.exp(terms - top)
    total = weights.sum(axis=0)
    weights /= total  # d lse / d term_k
    residual = top + np.log(total) - log_loss
    magnitude = np.abs(residual)
    small = magnitude <= delta
    value = np.where(small, 0.5 * residual * residual, delta * (magnitude - 0.5 * delta)).sum()
    psi = np.clip(residual, -delta, delta)  # d huber / d residual
    return float(value), np.einsum("kn,knp->p", weights * psi, mats)


def _minimise(problem: _Problem, log_loss: np.ndarray, starts: np.ndarray) -> tuple[optimize.OptimizeResult, list]:
    """L-BFGS-B from every start; returns the best result and all results (with their `start`) by objective."""
    results, args = [], (problem.mats, log_loss, problem.delta)
    options = {**_OPTIONS, "maxiter": problem.maxiter}
    for start in starts:
        with np.errstate(over="ignore", invalid="ignore"):
            result = optimize.minimize(
                _objective, start, args, "L-BFGS-B", True, bounds=problem.bounds, options=options
            )
        if np.isfinite(result.fun):
            results.append(optimize.OptimizeResult(result, start=start))
    if not results:
        raise FitNotConverged("no starting point gave a finite loss: check the data for outliers")
    results.sort(key=lambda r: r.fun)
    return results[0], results


def _check_convergence(result: optimize.OptimizeResult, on_nonconvergence: str, what: str) -> None:
    if not result.success and on_nonconvergence == "raise":
        raise FitNotConverged(
            f"{what}: L-BFGS-B did not converge from the best starting point ({result.message}; "
            f"{result.nit} iterations, loss {result.fun:.6g}); pass on_nonconvergence='flag' to get the fit anyway"
        )


def _positive_array(name: str, values, n: int | None = None) -> np.ndarray:
    """A 1-D float array of positive finite values, or ValueError naming the first bad one."""
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name}: expected numbers ({error})") from None
    if array.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence, got shape {array.shape}")
    if n is not None and len(array) != n:
        raise ValueError(f"{name}: {len(array)} values, expected {n} (one per run)")
    bad = np.flatnonzero(~(np.isfinite(array) & (array > 0)))
    if len(bad):
        raise ValueError(f"{name}[{bad[0]}] = {float(array[bad[0]])!r}: expected a positive finite number")
    return array


def _labels(name: str, values, n: int) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    if len(array) != n:
        raise ValueError(f"{name}: {len(array)} values, expected {n} (one per run)")
    return array


def _check_options(on_nonconvergence: str, huber_delta: float, maxiter: int = 1) -> None:
    if on_nonconvergence not in ("raise", "flag"):
        raise ValueError(f"on_nonconvergence={on_nonconvergence!r}: expected 'raise' or 'flag'")
    if not (huber_delta > 0 and math.isfinite(huber_delta)) or maxiter < 1:
        raise ValueError(f"huber_delta={huber_delta!r}, maxiter={maxiter!r}: expected delta > 0, maxiter >= 1")


def _inputs(compute, loss, row, seed, scale):
    """Checked (compute, loss, row, seed, scale, rows) of `fit_compute_law` and `select_by_holdout`."""
    compute = _positive_array("compute", compute)
    n = len(compute)
    loss = _positive_array("loss", loss, n)
    row = _labels("row", row, n)
    seed = None if seed is None else _labels("seed", seed, n)
    scale = compute if scale is None else _positive_array("scale", scale, n)
    return compute, loss, row, seed, scale, tuple(dict.fromkeys(row.tolist()))


def _check_count(cells: np.ndarray, n_params: int, what: str) -> None:
    if cells.max() + 1 < n_params:
        raise ValueError(f"{what}: {cells.max() + 1} distinct cells for {n_params} parameters; need at least as many")


def _cell_ids(keys: list[tuple], seed, what: str) -> np.ndarray:
    """Cell index of each run; with seeds, each (cell, seed) must occur once."""
    index = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    if seed is not None:
        seen = set()
        for key, s in zip(keys, seed):
            if (key, s) in seen:
                raise ValueError(f"seed {s!r} occurs twice in {what} {key!r}: expected one run per seed")
            seen.add((key, s))
    return np.array([index[key] for key in keys], dtype=int)


def _refitted(fit, result: optimize.OptimizeResult, ends: list):
    """`fit` with the parameters of `result` (and the starts of `ends`, the results of every start, best first)."""
    done = {"objective": float(result.fun), "converged": bool(result.success), "message": str(result.message)}
    starts = np.array([e.start for e in ends])
    return dataclasses.replace(fit, theta=np.asarray(result.x, float), best_starts=starts, **done)


@dataclasses.dataclass(frozen=True, repr=False, eq=False)
class ComputeLawFit:
    """L(C) = E + A_row * C^-alpha_row fitted by `fit_compute_law`; losses in nats, compute in FLOPs.

    Attributes:
        rows: the rows, in order of first appearance.
        shared_exponent: one alpha for all rows (True) or one per row.
        E: irreducible loss (nats), shared by the rows; `A`: row -> coefficient (nats FLOPs^alpha); `alpha`: row ->
            exponent (one value for every row when shared). Properties, from `theta`, at full precision.
        theta: the optimum, [log E, alpha (1 or one per row), log A_row - alpha_row * centre].
        objective: the summed Huber loss at the optimum; converged, message: L-BFGS-B's, from the best start.
        problem, centre, compute, best_starts: the data (centre: mean log C), the grid's starts best first.
    """

    rows: tuple
    shared_exponent: bool
    theta: np.ndarray
    objective: float
    converged: bool
    message: str
    problem: _Problem
    centre: float
    compute: np.ndarray
    best_starts: np.ndarray

    E = property(lambda self: float(np.exp(self.theta[0])), doc="Irreducible loss, nats.")

    @property
    def alpha(self) -> dict:
        """Row -> exponent."""
        return {r: float(self.theta[1 if self.shared_exponent else 1 + i]) for i, r in enumerate(self.rows)}

    @property
    def A(self) -> dict:
        """Row -> coefficient."""
        offset, alpha = len(self.theta) - len(self.rows), self.alpha
        return {r: float(np.exp(self.theta[offset + i] + alpha[r] * self.centre)) for i, r in enumerate(self.rows)}

    def __repr__(self) -> str:
        return f"ComputeLawFit({self.parameters()}, converged={self.converged})"

    def parameters(self) -> dict[str, float]:
        """Flat names -> values: `E`, `alpha` (shared) or `alpha[row]`, and `A[row]`."""
        alpha = self.alpha
        out = {"E": self.E}
        out.update({"alpha": alpha[self.rows[0]]} if self.shared_exponent else {f"alpha[{r}]": alpha[r] for r in alpha})
        out.update({f"A[{r}]": a for r, a in self.A.items()})
        return out

    def predict(self, compute, row) -> np.ndarray:
        """Predicted loss (nats) of `row` at `compute` FLOPs (scalar or array); KeyError for an unknown row."""
        if row not in self.rows:
            raise KeyError(f"row {row!r} was not fitted; fitted rows: {list(self.rows)}")
        return self.E + self.A[row] * np.asarray(compute, dtype=float) ** -self.alpha[row]

    def crossing(self, row, reference, compute_range: tuple[float, float]) -> float | None:
        """Compute (FLOPs) where `row`'s and `reference`'s curves cross, or None if not within `compute_range`.

        With E shared, L_row = L_ref where A_row C^-alpha_row = A_ref C^-alpha_ref, at log C = (log A_row -
        log A_ref) / (alpha_row - alpha_ref): one crossing at most, none with a shared exponent (parallel curves).
        """
        alpha, a = self.alpha, self.A
        if alpha[row] == alpha[reference]:
            return None
        log_c = (math.log(a[row]) - math.log(a[reference])) / (alpha[row] - alpha[reference])
        return math.exp(log_c) if math.log(compute_range[0]) <= log_c <= math.log(compute_range[1]) else None


def fit_compute_law(
    compute: Sequence[float],
    loss: Sequence[float],
    row: Sequence,
    seed: Sequence | None = None,
    *,
    shared_exponent: bool = True,
    scale: Sequence[float] | None = None,
    huber_delta: float = HUBER_DELTA,
    on_nonconvergence: str = "raise",
    maxiter: int = _OPTIONS["maxiter"],
) -> ComputeLawFit:
    """Fit L = E + A_row * C^-alpha to one family's final losses, each row's against its training compute.

    log L_pred = logsumexp(e, a_row - alpha_row * log C) with E = exp(e), A_row = exp(a_row); the summed Huber loss
    (delta `huber_delta`) of log L_pred - log L_obs is minimised by L-BFGS-B from a grid of 64 starts (E 0.1, 0.4,
    0.7 or 0.9 of the smallest loss; alpha 0.1, 0.3, 0.6 or 1; the reducible loss at the mean log C 3 %, 10 %, 30 %
    or 100 % of the mean loss), as Hoffmann et al. 2022 approach 3 with Besiroglu et al. 2024's corrections.

    Args:
        compute: (n,) training compute of each run, FLOPs (> 0).
        loss: (n,) final loss of each run, nats (> 0).
        row: (n,) row label of each run (hashable).
        seed: (n,) seed of each run, optional; each (row, scale, seed) must occur once.
        shared_exponent: one alpha for all rows (rows differ by A_row only) or one alpha per row.
        scale: (n,) numeric scale of each run (e.g. the model size); the runs of one row at one scale form a cell
            whose seeds `bootstrap` resamples together. Default: the compute itself.
        huber_delta: Huber threshold on log-space residuals.
        on_nonconvergence: "raise" (`FitNotConverged`) or "flag" (`converged=False` in the result).
        maxiter: L-BFGS-B iterations per start.

    Returns:
        A `ComputeLawFit`.

    Raises:
        ValueError: lengths differ, a compute or loss is not positive and finite, a (row, scale, seed) repeats,
            there are fewer distinct (row, scale) cells than parameters (rows + 2 shared, 2 rows + 1 per row), or
            with per-row exponents a row has one compute value.
        FitNotConverged: the best start did not converge and `on_nonconvergence="raise"`.
    """
    _check_options(on_nonconvergence, huber_delta, maxiter)
    compute, loss, row, seed, scale, rows = _inputs(compute, loss, row, seed, scale)
    n, n_rows = len(compute), len(rows)
    cells = _cell_ids(list(zip(row.tolist(), scale.tolist())), seed, "(row, scale) cell")
    n_alpha = 1 if shared_exponent else n_rows
    _check_count(cells, 1 + n_alpha + n_rows, "fit_compute_law: (row, scale)")
    for r in rows if not shared_exponent else ():
        if len(set(compute[row == r])) < 2:
            raise ValueError(f"row {r!r}: one compute value; an exponent per row needs at least two per row")
    row_index = np.array([rows.index(r) for r in row])
    centre = float(np.log(compute).mean())
    mats = np.zeros((2, n, 1 + n_alpha + n_rows))  # theta = [e, alpha_1..alpha_m, centred a_1..a_R]
    mats[0, :, 0] = 1.0
    mats[1, np.arange(n), 1 + (0 if shared_exponent else row_index)] = centre - np.log(compute)
    mats[1, np.arange(n), 1 + n_alpha + row_index] = 1.0
    grid = itertools.product(
        np.log(loss.min() * np.array([0.1, 0.4, 0.7, 0.9])),
        (0.1, 0.3, 0.6, 1.0),
        np.log(loss.mean() * np.array([0.03, 0.1, 0.3, 1.0])),
    )
    starts = np.array([[e] + [al] * n_alpha + [a] * n_rows for e, al, a in grid])
    bounds = ((None, None),) + ((0.0, None),) * n_alpha + ((None, None),) * n_rows
    problem = _Problem(mats, np.log(loss), cells, starts, bounds, huber_delta, maxiter)
    best, ends = _minimise(problem, problem.log_loss, starts)
    _check_convergence(best, on_nonconvergence, "fit_compute_law")
    empty = ComputeLawFit(rows, shared_exponent, None, math.nan, False, "", problem, centre, compute, None)
    return _refitted(empty, best, ends)


@dataclasses.dataclass(frozen=True)
class HoldoutSelection:
    """`select_by_holdout`'s outcome.

    Attributes:
        choice: "shared" or "per_row", the variant with the smaller error; errors: variant -> mean absolute error
            (nats) over the held-out cells; cell_errors: variant -> row -> predicted - observed mean loss (nats) at
            the row's largest scale; fits: variant -> the `ComputeLawFit` on the scales below the largest.
    """

    choice: str
    errors: dict
    cell_errors: dict
    fits: dict


def select_by_holdout(
    compute: Sequence[float],
    loss: Sequence[float],
    row: Sequence,
    seed: Sequence | None = None,
    *,
    scale: Sequence[float] | None = None,
    huber_delta: float = HUBER_DELTA,
    on_nonconvergence: str = "raise",
) -> HoldoutSelection:
    """Choose a shared or a per-row exponent by the prediction error at each row's largest scale.

    Both variants of `fit_compute_law` are fitted to the runs below each row's largest scale and predict the
    held-out cells (each row's runs at its largest `scale`, at their mean compute); the variant with the smaller
    mean absolute error (nats) against the cells' mean observed loss is chosen (shared on a tie).

    Args:
        compute: (n,) training compute of each run, FLOPs, as `fit_compute_law`.
        loss: (n,) final loss of each run, nats.
        row: (n,) row label of each run.
        seed: (n,) seed of each run, optional.
        scale: (n,) numeric scale of each run; default the compute. Each row's largest is held out.
        huber_delta: as `fit_compute_law`.
        on_nonconvergence: as `fit_compute_law`.

    Returns:
        A `HoldoutSelection`.

    Raises:
        ValueError: as `fit_compute_law` on the runs left for fitting, or a row with one scale.
        FitNotConverged: as `fit_compute_law`.
    """
    _check_options(on_nonconvergence, huber_delta)
    compute, loss, row, seed, scale, rows = _inputs(compute, loss, row, seed, scale)
    held = {}  # row -> mask of its runs at its largest scale
    for r in rows:
        if len(set(scale[row == r])) < 2:
            raise ValueError(f"row {r!r}: one scale; holding out the largest needs at least two")
        held[r] = (row == r) & (scale == scale[row == r].max())
    keep = ~np.any(list(held.values()), axis=0)
    kept = (compute[keep], loss[keep], row[keep], None if seed is None else seed[keep])
    options = {"scale": scale[keep], "huber_delta": huber_delta, "on_nonconvergence": on_nonconvergence}
    errors, cell_errors, fits = {}, {}, {}
    for name, shared in (("shared", True), ("per_row", False)):
        fits[name] = fit = fit_compute_law(*kept, shared_exponent=shared, **options)
        cell_errors[name] = {r: float(fit.predict(compute[m].mean(), r) - loss[m].mean()) for r, m in held.items()}
        errors[name] = float(np.mean(np.abs(list(cell_errors[name].values()))))
    choice = "shared" if errors["shared"] <= errors["per_row"] else "per_row"
    return HoldoutSelection(choice, errors, cell_errors, fits)


@dataclasses.dataclass(frozen=True, repr=False, eq=False)
class ChinchillaFit:
    """L(N, D) = E + A / N^alpha + B / D^beta fitted by `fit_chinchilla` (N parameters, D tokens, L nats).

    Attributes:
        E, A, B, alpha, beta: the fitted law (Hoffmann et al. 2022, eq. 2); properties, from `theta`.
        theta: the optimum, [log E, log A - alpha * centres[0], alpha, log B - beta * centres[1], beta].
        objective, converged, message, problem, best_starts: as `ComputeLawFit`; centres: mean log N, mean log D.
    """

    theta: np.ndarray
    objective: float
    converged: bool
    message: str
    problem: _Problem
    centres: tuple
    best_starts: np.ndarray

    E = property(lambda self: float(np.exp(self.theta[0])))
    A = property(lambda self: float(np.exp(self.theta[1] + self.theta[2] * self.centres[0])))
    alpha = property(lambda self: float(self.theta[2]))
    B = property(lambda self: float(np.exp(self.theta[3] + self.theta[4] * self.centres[1])))
    beta = property(lambda self: float(self.theta[4]))

    def __repr__(self) -> str:
        return f"ChinchillaFit({self.parameters()}, converged={self.converged})"

    def parameters(self) -> dict[str, float]:
        """Names -> values: `E`, `A`, `B`, `alpha`, `beta`."""
        return {"E": self.E, "A": self.A, "B": self.B, "alpha": self.alpha, "beta": self.beta}

    def predict(self, n_params, n_tokens) -> np.ndarray:
        """Predicted loss (nats) at N parameters and D tokens (scalars or broadcastable arrays)."""
        n_params, n_tokens = np.asarray(n_params, dtype=float), np.asarray(n_tokens, dtype=float)
        return self.E + self.A * n_params**-self.alpha + self.B * n_tokens**-self.beta

    def compute_optimal(
        self, compute: float, flops_per_token: float | Callable[[float], float] = 6.0
    ) -> tuple[float, float, float]:
        """Compute-optimal (N_opt, D_opt, D_opt / N_opt) at `compute` FLOPs.

        With C = k N D (`flops_per_token` a ratio k; 6 is Kaplan et al. 2020's 6N per token) the closed form of
        Hoffmann et al. 2022, eq. 4 (App. D.2) with C/6 replaced by C/k: G = (alpha A / (beta B))^(1 / (alpha +
        beta)), N_opt = G (C/k)^(beta / (alpha + beta)), D_opt = G^-1 (C/k)^(alpha / (alpha + beta)). With
        `flops_per_token` a function N -> training FLOPs per token (e.g. hfzoo's count, `hfzoo.models.flops`,
        interpolated over model sizes), D = C / flops_per_token(N) and L(N, D) is minimised over log N numerically
        (`scipy.optimize.minimize_scalar`, within a factor e^10 of the 6ND optimum).

        Raises:
            ValueError: `compute` or the ratio is not positive and finite, or the numerical optimum lies at the
                edge of its search range.
        """
        compute = float(_positive_array("compute", [compute])[0])
        k = 6.0 if callable(flops_per_token) else float(_positive_array("flops_per_token", [flops_per_token])[0])
        s = self.alpha + self.beta
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / s)
        n_opt, d_opt = g * (compute / k) ** (self.beta / s), (compute / k) ** (self.alpha / s) / g
        if callable(flops_per_token):
            lo, hi = math.log(n_opt) - 10.0, math.log(n_opt) + 10.0
            found = optimize.minimize_scalar(
                lambda log_n: float(self.predict(math.exp(log_n), compute / flops_per_token(math.exp(log_n)))),
                bounds=(lo, hi),
                method="bounded",
                options={"xatol": 1e-10},
            )
            if not lo + 1e-3 < found.x < hi - 1e-3:
                raise ValueError(f"compute_optimal: the optimal N at C={compute:g} is outside [e^{lo:.3g}, e^{hi:.3g}]")
            n_opt = math.exp(found.x)
            d_opt = compute / flops_per_token(n_opt)
        return n_opt, d_opt, d_opt / n_opt


def fit_chinchilla(
    n_params: Sequence[float],
    n_tokens: Sequence[float],
    loss: Sequence[float],
    seed: Sequence | None = None,
    *,
    huber_delta: float = HUBER_DELTA,
    on_nonconvergence: str = "raise",
    maxiter: int = _OPTIONS["maxiter"],
) -> ChinchillaFit:
    """Fit L(N, D) = E + A / N^alpha + B / D^beta (Hoffmann et al. 2022, eq. 2, approach 3).

    log L_pred = logsumexp(e, a - alpha log N, b - beta log D), the summed Huber loss (delta `huber_delta`) of
    log L_pred - log L_obs minimised by L-BFGS-B from a grid of 4 x 2^4 = 64 starts (E 0.1, 0.4, 0.7 or 0.9 of the
    smallest loss; each reducible term at the mean log N, log D 5 % or 30 % of the mean loss; exponents 0.15 or
    0.5), with Besiroglu et al. 2024's corrections (module docstring). Runs of one (N, D) cell with different
    seeds are resampled together by `bootstrap`.

    Args:
        n_params: (n,) model parameters of each run (> 0).
        n_tokens: (n,) training tokens of each run (> 0).
        loss: (n,) final loss of each run, nats (> 0).
        seed: (n,) seed of each run, optional; each (N, D, seed) must occur once.
        huber_delta: Huber threshold on log-space residuals.
        on_nonconvergence: "raise" (`FitNotConverged`) or "flag" (`converged=False` in the result).
        maxiter: L-BFGS-B iterations per start.

    Returns:
        A `ChinchillaFit`.

    Raises:
        ValueError: lengths differ, a value is not positive and finite, an (N, D, seed) repeats, there are fewer
            than 5 distinct (N, D) cells, or one distinct N or D.
        FitNotConverged: the best start did not converge and `on_nonconvergence="raise"`.
    """
    _check_options(on_nonconvergence, huber_delta, maxiter)
    n_params = _positive_array("n_params", n_params)
    n = len(n_params)
    n_tokens, loss = _positive_array("n_tokens", n_tokens, n), _positive_array("loss", loss, n)
    cells = _cell_ids(
        list(zip(n_params.tolist(), n_tokens.tolist())), None if seed is None else _labels("seed", seed, n), "(N, D)"
    )
    _check_count(cells, 5, "fit_chinchilla: (N, D)")
    for name, values in (("n_params", n_params), ("n_tokens", n_tokens)):
        if len(set(values)) < 2:
            raise ValueError(f"{name}: one distinct value ({values[0]:g}); its exponent needs at least two")
    centres = (float(np.log(n_params).mean()), float(np.log(n_tokens).mean()))
    mats = np.zeros((3, n, 5))  # theta = [e, centred a, alpha, centred b, beta]
    mats[0, :, 0] = 1.0
    mats[1, :, 1], mats[1, :, 2] = 1.0, centres[0] - np.log(n_params)
    mats[2, :, 3], mats[2, :, 4] = 1.0, centres[1] - np.log(n_tokens)
    reducible, exponents = np.log(loss.mean() * np.array([0.05, 0.3])), (0.15, 0.5)
    e_grid = np.log(loss.min() * np.array([0.1, 0.4, 0.7, 0.9]))
    starts = np.array(list(itertools.product(e_grid, reducible, exponents, reducible, exponents)))
    bounds = ((None, None), (None, None), (0.0, None), (None, None), (0.0, None))
    problem = _Problem(mats, np.log(loss), cells, starts, bounds, huber_delta, maxiter)
    best, ends = _minimise(problem, problem.log_loss, starts)
    _check_convergence(best, on_nonconvergence, "fit_chinchilla")
    return _refitted(ChinchillaFit(None, math.nan, False, "", problem, centres, None), best, ends)


def resample_within_cells(cells: Sequence[int], rng: np.random.Generator, n_resamples: int = 1) -> np.ndarray:
    """Indices of bootstrap replicates that resample observations with replacement inside each cell.

    Args:
        cells: (n,) cell id of each observation (the runs of one (row, scale) cell, differing by seed).
        rng: the numpy Generator drawn from.
        n_resamples: replicates.

    Returns:
        (n_resamples, n) int array: replicate j's observation i is observation `out[j, i]`, drawn uniformly from
        the observations of i's cell, so each cell keeps its size and never receives another cell's runs.
    """
    cells = np.asarray(cells)
    order = np.argsort(cells, kind="stable")
    _, first, counts = np.unique(cells[order], return_index=True, return_counts=True)
    position = np.searchsorted(np.unique(cells), cells)
    draws = (rng.random((n_resamples, len(cells))) * counts[position]).astype(int)
    return order[first[position] + draws]


@dataclasses.dataclass(frozen=True, eq=False)
class BootstrapResult:
    """`bootstrap`'s percentile intervals.

    Attributes:
        estimates: name -> value of the full-data fit (None for a crossing that does not occur).
        intervals: name -> (low, high) percentile interval over the replicates where the value is defined
            (None where it is defined in none).
        replicates: name -> (converged replicates,) values, NaN where undefined (no crossing in range).
        defined_fraction: name -> fraction of converged replicates where the value is defined (1 except crossings).
        confidence: the intervals' level; n_resamples: replicates drawn; n_failed: replicates whose best start did
            not converge, left out.
    """

    estimates: dict
    intervals: dict
    replicates: dict
    defined_fraction: dict
    confidence: float
    n_resamples: int
    n_failed: int


def _targets(target_compute, rows) -> dict:
    """Row -> target compute (FLOPs) from a number or a mapping; ValueError for a missing row or a bad value."""
    if not isinstance(target_compute, Mapping):
        return dict.fromkeys(rows, float(_positive_array("target_compute", [target_compute])[0]))
    missing = [r for r in rows if r not in target_compute]
    if missing:
        raise ValueError(f"target_compute: no compute for rows {missing}")
    return dict(zip(rows, _positive_array("target_compute", [target_compute[r] for r in rows])))


def _derived(fit, target_compute, reference_row, compute_range, flops_per_token) -> dict[str, float | None]:
    """The parameters of `fit` and the quantities `bootstrap` derives from them."""
    out: dict[str, float | None] = dict(fit.parameters())
    if isinstance(fit, ComputeLawFit):
        if target_compute is not None:
            for r, c in _targets(target_compute, fit.rows).items():
                out[f"prediction[{r}]"] = float(fit.predict(c, r))
        if reference_row is not None:
            for r in fit.rows:
                if r != reference_row:
                    out[f"crossing[{r}]"] = fit.crossing(r, reference_row, compute_range)
    elif target_compute is not None:
        n_opt, d_opt, ratio = fit.compute_optimal(target_compute, flops_per_token)
        out.update({"N_opt": n_opt, "D_opt": d_opt, "tokens_per_parameter": ratio})
    return out


def bootstrap(
    fit: ComputeLawFit | ChinchillaFit,
    *,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    rng: np.random.Generator | int = 0,
    target_compute: float | Mapping | None = None,
    reference_row=None,
    compute_range: tuple[float, float] | None = None,
    flops_per_token: float | Callable[[float], float] = 6.0,
    warm_starts: int = 2,
) -> BootstrapResult:
    """Percentile bootstrap intervals of a fit's parameters and derived quantities, resampling seeds in each cell.

    Each replicate draws, inside every cell ((row, scale) of `fit_compute_law`, (N, D) of `fit_chinchilla`), as
    many runs as the cell has, with replacement (`resample_within_cells`), and refits by the same method, started
    from the full-data optimum and the `warm_starts` starts of the full fit's grid that ended best. A cell with one
    seed contributes no resampling variation, and with few seeds per cell the intervals are too narrow (resampling
    n seeds reproduces (n - 1) / n of their variance, and only a few distinct resamples exist): read them as such.

    Derived quantities (names in the result): for a `ComputeLawFit`, `prediction[row]`, the loss at
    `target_compute` FLOPs (a number, or row -> FLOPs when rows differ in compute at one size), and with
    `reference_row` (e.g. the vanilla row) `crossing[row]`, the compute where the row's curve crosses the
    reference's within `compute_range` (default: the fitted compute range up to `target_compute`), NaN in replicates
    without a crossing; for a `ChinchillaFit` at `target_compute`, `N_opt`, `D_opt` and `tokens_per_parameter`
    (`ChinchillaFit.compute_optimal` with `flops_per_token`).

    Args:
        fit: a full-data fit (it keeps its data).
        n_resamples: replicates (1,000 or more for 95 % intervals).
        confidence: interval level in (0, 1).
        rng: a numpy Generator or a seed for `np.random.default_rng` (reproducible).
        target_compute: FLOPs (or row -> FLOPs) of the predictions (`ComputeLawFit`) or of the compute-optimal
            allocation (`ChinchillaFit`).
        reference_row: the row whose crossing with every other row is derived (`ComputeLawFit`).
        compute_range: (low, high) FLOPs where a crossing counts.
        flops_per_token: as `ChinchillaFit.compute_optimal`.
        warm_starts: extra starting points per replicate besides the full-data optimum.

    Returns:
        A `BootstrapResult`.

    Raises:
        ValueError: `n_resamples` < 1, `confidence` outside (0, 1), an unknown `reference_row`, or an option that
            does not apply to the fit's type.
    """
    if n_resamples < 1 or not 0 < confidence < 1:
        raise ValueError(f"n_resamples={n_resamples}, confidence={confidence}: expected >= 1 and a level in (0, 1)")
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    if isinstance(fit, ComputeLawFit):
        if reference_row is not None and reference_row not in fit.rows:
            raise ValueError(f"reference_row={reference_row!r}: not a fitted row; fitted rows: {list(fit.rows)}")
        if compute_range is None:
            targets = [] if target_compute is None else list(_targets(target_compute, fit.rows).values())
            compute_range = (float(fit.compute.min()), max([float(fit.compute.max()), *targets]))
    elif isinstance(fit, ChinchillaFit):
        if reference_row is not None or compute_range is not None:
            raise ValueError("reference_row and compute_range apply to a ComputeLawFit, not a ChinchillaFit")
    else:
        raise TypeError(f"fit: expected a ComputeLawFit or ChinchillaFit, got {type(fit).__name__}")
    # the full-data optimum, then the grid's starts that ended best on the full data
    problem, starts = fit.problem, np.array([fit.theta, *fit.best_starts[:warm_starts]])
    estimates = _derived(fit, target_compute, reference_row, compute_range, flops_per_token)
    values = {name: [] for name in estimates}
    failed = 0
    for index in resample_within_cells(problem.cells, rng, n_resamples):
        best, _ = _minimise(problem, problem.log_loss[index], starts)
        if not best.success:
            failed += 1
            continue
        replicate = _derived(_refitted(fit, best, []), target_compute, reference_row, compute_range, flops_per_token)
        for name, value in replicate.items():
            values[name].append(math.nan if value is None else value)
    tail, replicates, intervals, defined = 100 * (1 - confidence) / 2, {}, {}, {}
    for name, column in values.items():
        replicates[name] = column = np.asarray(column, dtype=float)
        finite = column[np.isfinite(column)]
        defined[name] = len(finite) / len(column) if len(column) else 0.0
        intervals[name] = tuple(float(v) for v in np.percentile(finite, [tail, 100 - tail])) if len(finite) else None
    return BootstrapResult(estimates, intervals, replicates, defined, confidence, n_resamples, failed)


def ranking_spearman(
    result: BootstrapResult, reference: Mapping, confidence: float | None = None
) -> tuple[float, float, float]:
    """Spearman's rho of the rows' extrapolated losses against reference values, with a bootstrap interval.

    rho is `scipy.stats.spearmanr` of `prediction[row]` (the full-data fit's loss at `bootstrap`'s
    `target_compute`) against `reference[row]` over the rows of `reference` (e.g. the losses measured at that
    compute, or the paper's ranks: any values ordered as the losses); the interval is the percentile interval of
    the same rho computed on each bootstrap replicate's predictions (NaN replicates, constant within a replicate,
    are left out). The interval reflects the fit's uncertainty from the seeds, with the reference held fixed.

    Args:
        result: a `bootstrap` result of a `ComputeLawFit` with `target_compute`.
        reference: row -> reference value, at least 3 rows.
        confidence: the interval's level; default the bootstrap's.

    Returns:
        (rho, low, high).

    Raises:
        ValueError: fewer than 3 reference rows, or a row without a prediction in `result`.
    """
    if len(reference) < 3:
        raise ValueError(f"reference: {len(reference)} rows, expected at least 3 for a rank correlation")
    if confidence is not None and not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence}: expected a level in (0, 1)")
    missing = [r for r in reference if f"prediction[{r}]" not in result.estimates]
    if missing:
        raise ValueError(f"reference rows {missing} have no prediction in the bootstrap (pass target_compute)")
    rows = list(reference)
    ref = np.array([reference[r] for r in rows], dtype=float)
    predicted = np.stack([result.replicates[f"prediction[{r}]"] for r in rows], axis=1)
    confidence = result.confidence if confidence is None else confidence
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        rho = float(stats.spearmanr([result.estimates[f"prediction[{r}]"] for r in rows], ref).statistic)
        rhos = np.array([stats.spearmanr(p, ref).statistic for p in predicted])
    rhos = rhos[np.isfinite(rhos)]
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(rhos, [tail, 100 - tail]) if len(rhos) else (math.nan, math.nan)
    return rho, float(low), float(high)
