"""One figure (PNG) from the JSON results of the throughput benchmarks (and, optionally, of resumption.py).

Panels, one above the other, one group of bars per server:

1. full handshakes per second with the python client: stock, plugin and the ``openssl s_server``
   ceiling measured in the same rounds (medians; the whiskers span the rounds);
2. server CPU time per handshake (same runs): stock, plugin, s_server;
3. with ``--resumption``: requests per second with session resumption, stock and plugin, TLS 1.3 and
   TLS 1.2, each bar labelled with the share of connections that were resumed.

    python benchmarks/handshake_throughput.py --json throughput.json
    python benchmarks/hypercorn_throughput.py --json hypercorn.json
    python benchmarks/resumption.py --json resumption.json
    python benchmarks/figure.py --throughput throughput.json --hypercorn hypercorn.json \\
        --resumption resumption.json --out docs/benchmarks.png

Needs matplotlib (``pip install 'tlsreload-plugins[bench]'``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

CLIENT = "python"
PAIRED = "paired"
COLORS = {"stock": "#9e9e9e", "plugin": "#1f77b4", "s_server": "#ffffff"}
LABELS = {"stock": "stock", "plugin": "with the plugin", "s_server": "openssl s_server (ceiling, same rounds)"}


def load(path: str | None, benchmark: str) -> dict[str, Any] | None:
    if path is None:
        return None
    data: dict[str, Any] = json.loads(Path(path).read_text())
    if data.get("benchmark") != benchmark:
        raise SystemExit(f"{path}: not a {benchmark}.py result (benchmark={data.get('benchmark')!r})")
    return data


def spread(values: list[float], middle: float) -> tuple[float, float]:
    """(below, above) the median: the whisker down to the slowest round and up to the fastest."""
    return (middle - min(values), max(values) - middle) if values else (0.0, 0.0)


def when(runs: list[tuple[str, dict[str, Any]]]) -> str:
    """The measurement date(s): from the results' machine block, else the files' modification time."""
    dates = []
    for path, data in runs:
        date = data.get("machine", {}).get("date (UTC)")
        if date is None:
            stamp = datetime.datetime.fromtimestamp(Path(path).stat().st_mtime, datetime.timezone.utc)
            date = stamp.strftime("%Y-%m-%d %H:%M")
        dates.append(date[:10])
    first, last = min(dates), max(dates)
    return first if first == last else f"{first} to {last}"


def label(ax: Any, x: float, top: float, text: str, **kw: Any) -> None:
    """``text`` just above ``top`` (the whisker's end) at ``x``."""
    style = {"xytext": (0, 3), "textcoords": "offset points", "ha": "center", "va": "bottom", "fontsize": 7, **kw}
    ax.annotate(text, (x, top), **style)


def bars(
    ax: Any, servers: list[str], series: list[tuple[str, list[float], list[tuple[float, float]]]]
) -> list[list[tuple[float, float]]]:
    """Grouped bars: one group per server, one bar per series (side, values, whiskers); per series, the
    (x, top of the whisker) of each bar, for labels."""
    width = 0.8 / len(series)
    drawn = []
    for i, (side, values, whiskers) in enumerate(series):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(servers))]
        yerr = [[w[0] for w in whiskers], [w[1] for w in whiskers]]
        hatch = "//" if side == "s_server" else None
        ax.bar(
            xs,
            values,
            width,
            label=LABELS[side],
            color=COLORS[side],
            edgecolor="#333333",
            hatch=hatch,
            yerr=yerr,
            capsize=3,
            error_kw={"elinewidth": 0.8, "ecolor": "#333333"},
        )
        drawn.append([(x, v + w[1]) for x, v, w in zip(xs, values, whiskers, strict=True)])
    ax.set_xticks(range(len(servers)), servers, rotation=15)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return drawn


def draw(args: argparse.Namespace) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("figure.py needs matplotlib: pip install 'tlsreload-plugins[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [
        (path, data)
        for path, data in (
            (args.throughput, load(args.throughput, "handshake_throughput")),
            (args.hypercorn, load(args.hypercorn, "hypercorn_throughput")),
        )
        if data is not None
    ]
    if not runs:
        raise SystemExit("give --throughput and/or --hypercorn")
    throughput = [r for _, data in runs for r in data["results"] if r["client"] == CLIENT]
    if not throughput:
        raise SystemExit(f"no results with the {CLIENT} client in the files given")
    resumption = load(args.resumption, "resumption")
    all_runs = runs + ([(args.resumption, resumption)] if resumption else [])
    quick = any(data.get("settings", {}).get("quick") for _, data in all_runs)
    ceiling = all("s_server_median" in r for r in throughput)

    panels = 3 if resumption else 2
    servers = [r["server"] for r in throughput]
    fig, axes = plt.subplots(panels, 1, figsize=(max(9.0, 1.5 * len(servers) + 3), 4.3 * panels))

    # 1. handshakes per second
    sides = ["stock", "plugin"] + (["s_server"] if ceiling else [])
    series = []
    for side in sides:
        values = [r[f"{side}_median"] for r in throughput]
        whiskers = [spread(r["rates"][side], r[f"{side}_median"]) for r in throughput]
        series.append((side, values, whiskers))
    ax = axes[0]
    drawn = bars(ax, servers, series)
    for (x, top), r in zip(drawn[1], throughput, strict=True):
        label(ax, x, top, f"{r['ratio']:.2f}x" + (f"\n{r['plugin_fraction']:.0%}" if ceiling else ""))
    settings = runs[0][1]["settings"]
    ax.set_ylabel("full handshakes / s (median)")
    ax.set_title(
        f"Full handshakes per second: {settings['python client processes']} python client processes, 1 server worker"
        "\n(label: plugin/stock over the plugin's rate as a share of s_server's; whiskers: slowest to fastest round)",
        fontsize=10,
    )
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)
    ax.legend(fontsize=8, loc="upper left", ncol=3)

    # 2. server CPU per handshake
    series = []
    for side in sides:
        values = [r[f"{side}_cpu_us"] for r in throughput]
        whiskers = [spread(r["cpu_us"][side], r[f"{side}_cpu_us"]) for r in throughput]
        series.append((side, values, whiskers))
    ax = axes[1]
    drawn = bars(ax, servers, series)
    paired = {r["server"]: r for _, data in runs for r in data["results"] if r["client"] == PAIRED}
    for (x, top), r in zip(drawn[1], throughput, strict=True):
        text = f"{r['plugin_cpu_us'] / r['stock_cpu_us']:.2f}x"
        same_window = paired.get(r["server"])
        if same_window is not None:
            text += f"\npaired {same_window['cpu_plugin_over_stock']:.3f}x"
        label(ax, x, top, text)
    ax.set_ylabel("server CPU µs / handshake (median)")
    ax.set_title(
        "Server CPU time (user + system, from /proc) per full handshake, same runs\n(label: plugin/stock; "
        "'paired': stock and plugin measured in the same windows; lower is better)",
        fontsize=10,
    )
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)
    ax.legend(fontsize=8, loc="upper left", ncol=3)

    # 3. resumption
    if resumption:
        ax = axes[2]
        results = resumption["results"]
        names = list(dict.fromkeys(r["server"] for r in results))
        versions = list(dict.fromkeys(r["tls"] for r in results))
        width = 0.8 / (2 * len(versions))
        k = 0
        for version in versions:
            for side in ("stock", "plugin"):
                by_server = {r["server"]: r for r in results if r["tls"] == version}
                xs, values, lows, highs, shares = [], [], [], [], []
                for x, name in enumerate(names):
                    if name not in by_server:
                        continue
                    r = by_server[name]
                    low, high = spread(r["rates"][side], r[f"{side}_median"])
                    xs.append(x + (k - (2 * len(versions) - 1) / 2) * width)
                    values.append(r[f"{side}_median"])
                    lows.append(low)
                    highs.append(high)
                    shares.append(r[f"{side}_resumed_fraction"])
                ax.bar(
                    xs,
                    values,
                    width,
                    label=f"TLS {version}, {LABELS[side]}",
                    color=COLORS[side],
                    edgecolor="#333333",
                    hatch=".." if version != versions[0] else None,
                    yerr=[lows, highs],
                    capsize=2,
                    error_kw={"elinewidth": 0.8, "ecolor": "#333333"},
                )
                for x, value, high, share in zip(xs, values, highs, shares, strict=True):
                    label(ax, x, value + high, f"{share:.0%}", fontsize=6, rotation=90)
                k += 1
        ax.set_xticks(range(len(names)), names, rotation=15)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        ax.set_ylabel("requests / s (median)")
        rs = resumption["settings"]
        ax.set_title(
            f"Session resumption: requests per second, {rs['client processes']} client processes, each connection "
            "offering the last session, then GET /\n(label: share of the connections that were resumed)",
            fontsize=10,
        )
        ax.set_ylim(0, ax.get_ylim()[1] * 1.3)
        ax.legend(fontsize=7, loc="upper left", ncol=2 * len(versions))

    machine = runs[0][1].get("machine", {})
    where = ", ".join(x for x in (machine.get("CPU"), f"{machine['cores']} cores" if "cores" in machine else None) if x)
    title = f"tlsreload-plugins: plugin against stock servers, measured {when(all_runs)}"
    if where:
        title += f"\n{where}; Python {machine.get('Python', '?')}, {machine.get('Python ssl', '?')}"
    if quick:
        title += "\nSMOKE RUN (--quick): the figures mean nothing"
    fig.suptitle(title, fontsize=11, color="#b00020" if quick else "black")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    plt.close(fig)
    print(f"wrote {args.out}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--throughput", help="JSON written by handshake_throughput.py --json")
    parser.add_argument("--hypercorn", help="JSON written by hypercorn_throughput.py --json")
    parser.add_argument("--resumption", help="JSON written by resumption.py --json (adds a third panel)")
    parser.add_argument("--out", default="docs/benchmarks.png", help="the PNG to write (default: %(default)s)")
    draw(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
