"""The demo's chart and closing line, from given figures (no load run): the share panel's legend clear of every
bar, and the one-line takeaway computed from the measured p99s."""

from __future__ import annotations

import pytest

from waypost.demo.load import Sample
from waypost.demo.runner import BACKENDS, POLICIES, SLOW, takeaway


def _summary(p99: float, shares: dict[str, float], errors: int = 0) -> dict:
    return {"calls": 1000, "errors": errors, "p50_ms": p99 / 4, "p99_ms": p99,
            "backends": {b: {"calls": int(s * 1000), "share": s, "p50_ms": 1.0, "p99_ms": 2.0}
                         for b, s in shares.items()}}


def _results() -> dict:
    names = [b[0] for b in BACKENDS]
    policies = {}
    for i, p in enumerate(POLICIES):
        if p == "pick_first":
            shares = {n: (1.0 if n == names[0] else 0.0) for n in names}
        else:
            shares = {n: 0.25 for n in names}
        policies[p] = _summary(10.0 + i, shares)
    return {"policies": policies}


def test_the_share_legend_covers_no_bar():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from waypost.demo.chart import figure

    samples = {p: [Sample(t=i / 100, latency=0.001 * (1 + i % 7), backend="b1", error=None) for i in range(50)]
               for p in POLICIES}
    fig = figure(samples, _results())
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax_share = fig.axes[1]
        legend = ax_share.get_legend().get_window_extent(renderer)
        bars = [p.get_window_extent(renderer) for p in ax_share.patches if isinstance(p, Rectangle) and p.get_height()]
        assert len(bars) >= len(POLICIES)  # every policy's stack is drawn (pick_first: one full-height bar)
        covered = [b for b in bars if b.overlaps(legend)]
        assert not covered, f"the legend {legend} covers {len(covered)} bar(s)"
        whole = fig.bbox
        assert whole.x0 <= legend.x0 and legend.x1 <= whole.x1, "the legend is cut off by the figure's edge"
    finally:
        plt.close(fig)


def test_the_takeaway_names_the_lowest_p99_and_its_gain_over_round_robin():
    names = [b[0] for b in BACKENDS]
    even = {n: 0.25 for n in names}
    skewed = {**{n: 0.32 for n in names}, SLOW: 0.04}
    one = {n: (1.0 if n == names[0] else 0.0) for n in names}
    line = takeaway({"round_robin": _summary(52.4, even), "p2c_ewma": _summary(13.1, skewed),
                     "least_request": _summary(20.0, skewed), "pick_first": _summary(7.0, one)})
    # pick_first's p99 comes from one backend taking every call: not the lesson
    assert line.startswith("Takeaway: p2c_ewma gave the lowest p99 of the policies that spread the calls, 13.1 ms"), line
    assert "4.0x lower than round_robin's 52.4 ms" in line and "4%" in line and "25%" in line, line
    # round_robin best: said so, no invented gain; a policy with errors is not a winner
    line = takeaway({"round_robin": _summary(5.0, even), "p2c_ewma": _summary(1.0, even, errors=3)})
    assert "round_robin itself" in line and "x lower" not in line, line
