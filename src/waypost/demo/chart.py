"""The demo's PNG: latency CDF per policy, and share of calls per backend per policy (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..service_config import DEFAULT_POLICY
from .load import Sample


def _label(policy: str) -> str:
    return f"{policy} (default)" if policy == DEFAULT_POLICY else policy


def write_chart(samples_by_policy: dict[str, list[Sample]], results: dict[str, Any],
                path: Path) -> tuple[Path | None, str]:
    """Write the chart to ``path``; returns (path, "") or (None, why it was skipped)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed (pip install 'waypost[plots]')"

    fig = figure(samples_by_policy, results)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.resolve(), ""


def figure(samples_by_policy: dict[str, list[Sample]], results: dict[str, Any]) -> Any:
    """The chart's matplotlib Figure (needs matplotlib). The share panel's legend sits right of its axes, clear
    of the bars (pick_first's bar is full height: a legend inside would cover it)."""
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, (ax_cdf, ax_share) = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")
    for policy, samples in samples_by_policy.items():
        lat = sorted(s.latency * 1000 for s in samples if s.error is None)
        if not lat:
            continue
        n = len(lat)
        ax_cdf.plot(lat, [(i + 1) / n for i in range(n)], label=_label(policy),
                    linewidth=2.6 if policy == DEFAULT_POLICY else 1.6)
    ax_cdf.set_xscale("log")
    ax_cdf.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax_cdf.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax_cdf.set_xlabel("latency (ms, log scale)")
    ax_cdf.set_ylabel("fraction of calls")
    ax_cdf.set_title("latency CDF per policy")
    ax_cdf.grid(True, which="both", alpha=0.3)
    ax_cdf.legend(fontsize=8, loc="lower right")

    policies = list(results["policies"])
    backends = list(next(iter(results["policies"].values()))["backends"]) if policies else []
    bottoms = [0.0] * len(policies)
    for b in backends:
        shares = [results["policies"][p]["backends"][b]["share"] * 100 for p in policies]
        ax_share.bar([_label(p) for p in policies], shares, bottom=bottoms, label=b + (" (slow)" if b == "b4" else ""))
        bottoms = [x + y for x, y in zip(bottoms, shares, strict=True)]
    ax_share.set_ylabel("share of calls (%)")
    ax_share.set_title("share per backend")
    ax_share.tick_params(axis="x", labelrotation=30, labelsize=8)
    for label in ax_share.get_xticklabels():  # long names end under their bar instead of overlapping the next
        label.set_horizontalalignment("right")
        label.set_rotation_mode("anchor")
    ax_share.set_ylim(0, 100)
    ax_share.legend(fontsize=8, title="backend", title_fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                    borderaxespad=0.0)
    fig.suptitle("waypost demo: 4 backends, b4 is 10x slower")
    return fig
