"""Paired rounds: the statistic the Python benchmarks print for a ratio keel/other.

Each round of a benchmark runs both sides back to back and gives one ratio, so drift slower
than a round (clock frequency, the VM's neighbours) cancels. The statistic is the median of
the rounds' ratios with the sign test's distribution-free interval for it (as bench_loop.cpp
computes it): order statistics x(k) and x(n+1-k) with the largest k whose coverage under
Binomial(n, 1/2) is at least the level. It assumes only independent rounds. With 9 rounds the
95% interval is [x(2), x(8)] (96.1%): one outlying round on either side does not move it; from
6 to 8 rounds it is [min, max]; below 6 there is none at 95%.

The verdict says where the interval lies against 1.0 (keel ahead, behind, or not told apart),
whether a target is met (a median of at least the target with the interval's lower end above
1.0, which does not depend on the interval's width), and, when the interval is wider than
2 x `difference` (as bench_loop judges 1% with a 2% interval), that it is too wide to tell
apart differences of that size.
"""
import math
import statistics


def median_interval(xs, level=0.95):
    """(low, high, coverage) of the sign-test interval for the median of xs, or None when
    len(xs) rounds cannot reach `level` (fewer than 6 at 0.95, fewer than 5 at 0.9)."""
    n, xs = len(xs), sorted(xs)
    best = None
    for k in range(1, n // 2 + 1):
        below = sum(math.comb(n, i) for i in range(k)) / 2 ** n
        coverage = 1 - 2 * below
        if coverage < level:
            break
        best = (xs[k - 1], xs[n - k], coverage)
    return best


def summary(xs, interval=False, level=0.95):
    """"min M  median M" and, with interval, the median's interval and its coverage."""
    text = f"min {min(xs):.3f}  median {statistics.median(xs):.3f}"
    if interval:
        ci = median_interval(xs, level)
        text += (f"  median's interval [{ci[0]:.3f}, {ci[1]:.3f}] ({100 * ci[2]:.1f}% sign-test "
                 f"coverage)" if ci else
                 f"  (no {100 * level:g}% interval from {len(xs)} rounds: run more)")
    return text


def verdict(xs, target=None, difference=0.05, level=0.95, rerun="--rounds"):
    """One line: the median of the ratios xs (keel/other, > 1: keel faster), its interval, and
    what the interval says: keel ahead (the whole interval above 1.0), behind (below), or not
    told apart from the other side; given a target, whether it is met (the median at least
    `target` and the interval's lower end above 1.0); and when the interval is wider than
    2 x `difference`, that it is too wide to judge a difference of that size."""
    ci = median_interval(xs, level)
    med = statistics.median(xs)
    if ci is None:
        return (f"median {med:.3f} of {len(xs)} rounds; no {100 * level:g}% interval from so few "
                f"rounds: rerun with {rerun} 6 or more")
    low, high, coverage = ci
    text = (f"median {med:.3f} of {len(xs)} rounds, {100 * coverage:.1f}% interval "
            f"[{low:.3f}, {high:.3f}]: ")
    if low > 1.0:
        text += "keel ahead (the whole interval above 1.0)"
    elif high < 1.0:
        text += "keel behind (the whole interval below 1.0)"
    else:
        text += "the interval contains 1.0: the two sides are not told apart"
    if target is not None:
        met = med >= target and low > 1.0
        text += (f"; target median >= {target:g} with the interval above 1.0: "
                 f"{'met' if met else 'not met'}")
    if high - low > 2 * difference:
        text += (f"; the interval is {high - low:.3f} wide, too wide to judge a "
                 f"{100 * difference:g}% difference: rerun with more {rerun} on an idle machine")
    return text
