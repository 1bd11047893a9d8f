"""Chi-square goodness of fit for sampled tokens against an exact distribution."""

import numpy as np
from scipy import stats


def chi_square_pvalue(observed_counts: dict, expected_probs: dict, min_expected: float = 5.0) -> float:
    """Pool cells with small expected counts (standard practice) and return the p-value."""
    n = sum(observed_counts.values())
    keys = sorted(expected_probs, key=lambda k: -expected_probs[k])
    obs, exp, pooled_obs, pooled_exp = [], [], 0.0, 0.0
    for k in keys:
        e = expected_probs[k] * n
        if e >= min_expected:
            obs.append(observed_counts.get(k, 0))
            exp.append(e)
        else:
            pooled_obs += observed_counts.get(k, 0)
            pooled_exp += e
    unexpected = sum(v for k, v in observed_counts.items() if k not in expected_probs)
    pooled_obs += unexpected
    if pooled_exp > 0 or pooled_obs > 0:
        obs.append(pooled_obs)
        exp.append(max(pooled_exp, 1e-9))
    obs, exp = np.array(obs, float), np.array(exp, float)
    exp *= obs.sum() / exp.sum()
    return float(stats.chisquare(obs, exp).pvalue)
