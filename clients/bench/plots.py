"""PNG plots of bench runs (matplotlib, headless): latency CDFs; throughput and P99 TTFT against request rate."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infer.clients.bench.targets import RequestResult

if TYPE_CHECKING:
    from infer.clients.bench.metrics import BenchRun


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("plots need matplotlib: pip install 'infer[bench]' (or pass --no-plots)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


Pick = Callable[[Sequence[RequestResult]], list[float]]
LATENCIES: tuple[tuple[str, Pick], ...] = (
    ("TTFT", lambda rs: [r.ttft_s for r in rs if r.ok and r.ttft_s is not None]),
    ("inter-token latency", lambda rs: [g for r in rs if r.ok for g in r.gaps_s]),
    ("end-to-end latency", lambda rs: [r.e2e_s for r in rs if r.ok]),
)


def _cdf(ax: Any, values: Sequence[float], label: str) -> None:
    if not values:
        return
    xs = sorted(1000 * v for v in values)
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", label=label)


def plot_cdfs(runs: Sequence[BenchRun], path: Path, title: str = "") -> Path:
    """One panel per latency (TTFT, ITL, E2E), one line per run."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(LATENCIES), figsize=(5 * len(LATENCIES), 4))
    for ax, (name, pick) in zip(axes, LATENCIES, strict=True):
        for run in runs:
            results: Sequence[RequestResult] = run.results
            _cdf(ax, pick(results), run.label)
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} (ms, log scale)")
        ax.set_ylabel("share of samples")
        ax.grid(True, which="both", alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    fig.suptitle(title or "latency CDFs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sweep(runs: Sequence[BenchRun], path: Path, title: str = "") -> Path:
    """Output tok/s and P99 TTFT against the offered request rate, one line per target."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    by_target: dict[str, list[BenchRun]] = {}
    for run in runs:
        if run.rate is not None:
            by_target.setdefault(run.target, []).append(run)
    for target, group in by_target.items():
        group.sort(key=lambda r: r.rate or 0.0)
        rates = [r.rate for r in group]
        summaries = [r.summary for r in group]
        left.plot(rates, [s.output_tokens_per_s for s in summaries], marker="o", label=target)
        right.plot(rates, [1000 * s.ttft_s.p99 for s in summaries], marker="o", label=target)
    left.set_xlabel("offered load (requests/s)")
    left.set_ylabel("output tokens/s")
    right.set_xlabel("offered load (requests/s)")
    right.set_ylabel("P99 TTFT (ms)")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        if by_target:
            ax.legend(fontsize=7)
    fig.suptitle(title or "throughput and P99 TTFT vs request rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
