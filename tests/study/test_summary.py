"""`hfzoo.study.summary`: the statistics over the runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from hfzoo.study.summary import spearman_with_interval


def test_spearman_with_interval_known_answers():
    x = np.arange(10.0)
    # any monotone relation: rho 1 (-1 decreasing), in every resample too
    assert spearman_with_interval(x, 3 * x + 1) == pytest.approx((1.0, 1.0, 1.0))
    assert spearman_with_interval(x, -(x**3)) == pytest.approx((-1.0, -1.0, -1.0))
    # rho = 1 - 6 sum d^2 / (n (n^2 - 1)): two neighbouring ranks swapped twice: sum d^2 = 4, n = 10 -> 1 - 24/990
    y = np.array([1, 0, 2, 3, 4, 5, 6, 7, 9, 8], dtype=float)
    rho, low, high = spearman_with_interval(x, y)
    assert rho == pytest.approx(1 - 24 / 990) and low <= rho <= high <= 1.0
    assert (rho, low, high) == spearman_with_interval(x, y)  # the resampling is seeded: reproducible
    # the interval is scipy's percentile bootstrap of scipy's spearmanr (here evaluated one resample at a time)
    reference = stats.bootstrap(
        (x, y),
        lambda a, b: stats.spearmanr(a, b).statistic,
        paired=True,
        vectorized=False,
        n_resamples=999,
        method="percentile",
        rng=np.random.default_rng(0),
    )
    assert spearman_with_interval(x, y, n_resamples=999)[1:] == pytest.approx(tuple(reference.confidence_interval))
    # independent noise: an interval that contains 0
    rng = np.random.default_rng(1)
    _, low, high = spearman_with_interval(rng.normal(size=30), rng.normal(size=30))
    assert low < 0 < high
    assert all(math.isnan(v) for v in spearman_with_interval([1.0, 2.0], [2.0, 1.0]))  # two pairs: no rank test
