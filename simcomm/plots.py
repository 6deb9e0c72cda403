"""PNG plots: sweeps (time and bus bandwidth against size, one line per series; the PNGs of
a sweep's rows, one per ranks x bandwidth x latency), the timeline of one run (rows per rank
and a row per busy link), a DDP bucket-cap sweep, FSDP's memory over a step and histograms
of seeded samples' times.

Figures are drawn on matplotlib's Agg canvas directly, never through pyplot, so no display
is needed and nothing global (pyplot's current figure, the chosen backend) is touched; a
figure is freed like any object once it is no longer referenced. matplotlib is an optional
dependency (``pip install simcomm[plot]``); only this module imports it, and other modules
import this one only inside the functions that draw.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator

from simcomm.files import replacing
from simcomm.results import SimResult
from simcomm.sweep_csv import Series, SweepRow
from simcomm.training import FSDPReport, StepReport

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def size_label(nbytes: float) -> str:
    """A size axis label in binary units: 1024 -> ``1KiB``, 1536 -> ``1.5KiB``."""
    unit = 0
    while nbytes >= 1024 and unit < len(_BINARY_UNITS) - 1:
        nbytes /= 1024
        unit += 1
    return f"{nbytes:g}{_BINARY_UNITS[unit]}"


# Line styles and markers for the style keys of simulated series, in turn; measured series
# are dotted with crosses, so they never look simulated.
_STYLES = (("-", "o"), ("--", "s"), ("-.", "^"), ((0, (5, 1, 1, 1, 1, 1)), "D"))
_MEASURED_STYLE = (":", "x")


def _draw(axes: Axes, series: Series, values: Sequence[float], color: str,
          style: tuple[object, str]) -> None:
    # Log axes cannot show zeros (a 0-byte size, a 0 GB/s bus bandwidth on one rank).
    points = [(s, v) for s, v in zip(series.sizes, values) if s > 0 and v > 0]
    axes.plot([s for s, _ in points], [v for _, v in points], label=series.label,
              color=color, linestyle=style[0], marker=style[1], markersize=4)


def sweep_figure(title: str, simulated: Sequence[Series], measured: Sequence[Series] = ()
                 ) -> Figure:
    """Time (left) and bus bandwidth (right) against size, both on log axes: the
    ``simulated`` series in solid and dashed lines, the ``measured`` ones dotted with
    crosses."""
    figure = Figure(figsize=(12, 5), layout="constrained")
    FigureCanvasAgg(figure)
    time_axes, busbw_axes = figure.subplots(1, 2)
    palette = [f"C{i}" for i in range(10)]
    colors: dict[str, str] = {}
    styles: dict[str, tuple[object, str]] = {}
    lines = [(series, False) for series in simulated] + [(series, True) for series in measured]
    for series, is_measured in lines:
        key = series.color or series.label
        color = colors.setdefault(key, palette[len(colors) % len(palette)])
        if is_measured:
            style = _MEASURED_STYLE
        else:
            style = styles.setdefault(series.style, _STYLES[len(styles) % len(_STYLES)])
        _draw(time_axes, series, series.time_us, color, style)
        _draw(busbw_axes, series, series.busbw_GBps, color, style)
    for axes, label in ((time_axes, "time (us)"), (busbw_axes, "bus bandwidth (GB/s)")):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.xaxis.set_major_locator(LogLocator(base=2, numticks=7))
        axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: size_label(x)))
        axes.set_xlabel("size")
        axes.set_ylabel(label)
        axes.grid(True, which="major", alpha=0.3)
    if lines:
        figure.legend(*time_axes.get_legend_handles_labels(), loc="outside lower center",
                      ncols=min(len(lines), 3), fontsize="small")
    figure.suptitle(title)
    return figure


def save_png(figure: Figure, path: str | os.PathLike[str]) -> None:
    """Write ``figure`` as a PNG (its folder must exist: the commands check their paths
    as they read them), whole or not at all (``simcomm.files.replacing``)."""
    with replacing(path) as scratch:
        figure.savefig(scratch, format="png", dpi=100)


def figure_groups(rows: Sequence[SweepRow]) -> dict[tuple[int, str, str], list[Series]]:
    """Rows split into one figure per (ranks, bandwidth, latency), a series per algorithm
    (its colour) and topology (its line style); labels name the topology only where the
    figure has several."""
    groups: dict[tuple[int, str, str], dict[tuple[str, str], list[SweepRow]]] = {}
    for row in rows:
        groups.setdefault((row.ranks, row.bandwidth, row.latency), {}).setdefault(
            (row.algorithm, row.topology), []).append(row)
    figures = {}
    for key, lines in groups.items():
        several = len({topology for _, topology in lines}) > 1
        figures[key] = [Series.from_rows(f"{algorithm} @ {topology}" if several else algorithm,
                                         group, color=algorithm, style=topology)
                        for (algorithm, topology), group in lines.items()]
    return figures


def _file_part(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "." else "p" if ch == "/" else "_"
                   for ch in text)


def write_plots(rows: Sequence[SweepRow], out_dir: str | os.PathLike[str],
                measured: Sequence[Series] = ()) -> list[Path]:
    """One PNG per (ranks, bandwidth, latency) of ``rows`` under ``out_dir`` (time and busbw
    against size), with the ``measured`` series drawn on each; the paths written. With no
    rows, one PNG of the measured series alone."""
    out = Path(out_dir)
    paths = []
    groups = figure_groups(rows)
    if not groups:
        groups = {(0, "", ""): []}
    for (ranks, bandwidth, latency), series in groups.items():
        if ranks == 0:
            title, name = "measured", "measured"
        elif bandwidth or latency:
            title = f"{ranks} ranks, links {bandwidth} and {latency}"
            name = f"{ranks}ranks_{_file_part(bandwidth)}_{_file_part(latency)}"
        else:
            title, name = f"{ranks} ranks, preset or file topologies", f"{ranks}ranks"
        path = out / f"sweep_{name}.png"
        save_png(sweep_figure(title, series, measured), path)
        paths.append(path)
    return paths


# A timeline draws at most this many rows; a run of more ranks and links shows the first ones.
TIMELINE_MAX_ROWS = 64
_MEMORY_KINDS = ("reduce", "copy", "divide")


def _phase(label: str) -> str:
    # "reduce-scatter 3" and "reduce-scatter 4" are one phase: colour by the label's words.
    return label.rstrip("0123456789 ") or label


def timeline_figure(result: SimResult, title: str = "") -> Figure:
    """The run as horizontal bars against time (us): per rank a row of its sends, and
    rows of its compute and its local memory work where it has any; then a row per link
    that carried anything. Comm bars are coloured by the op's label, so the phases of a
    collective (reduce-scatter, all-gather) stand apart."""
    if result.messages > 0 and not result.trace:
        raise ValueError("a timeline needs the op trace: simulate with record=True")
    size = len(result.finish_times)
    spans: dict[tuple[int, str], list[tuple[float, float, str]]] = {}
    for e in result.trace:
        if e.kind == "send":
            spans.setdefault((e.rank, "comm"), []).append(
                (e.start, e.end, _phase(e.label or "send")))
        elif e.kind == "compute":
            spans.setdefault((e.rank, "compute"), []).append((e.start, e.end, "compute"))
        elif e.kind in _MEMORY_KINDS:
            spans.setdefault((e.rank, "memory"), []).append(
                (e.start, e.end, f"local {e.kind}"))
    rows: list[tuple[str, list[tuple[float, float, str]]]] = []
    for rank in range(size):
        rows.append((f"rank {rank} sends", spans.get((rank, "comm"), [])))
        rows += [(f"rank {rank} {kind}", spans[rank, kind]) for kind in ("compute", "memory")
                 if (rank, kind) in spans]
    sends = {e.message: e for e in result.trace if e.kind == "send"}
    link_spans: dict[int, list[tuple[float, float, str]]] = {}
    for hop in result.hops:
        label = _phase(sends[hop.message].label or "send")
        link_spans.setdefault(hop.link, []).append((hop.start, hop.end, label))
    for index in sorted(link_spans):
        link = result.links[index].link
        rows.append((f"{link.src} -> {link.dst}", link_spans[index]))
    shown = rows[:TIMELINE_MAX_ROWS]
    figure = Figure(figsize=(12, 1.5 + 0.28 * len(shown)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    palette = [f"C{i}" for i in range(10)]
    colors: dict[str, str] = {}
    for y, (_, spans) in enumerate(shown):
        by_color: dict[str, list[tuple[float, float]]] = {}
        for start, end, phase in spans:
            color = colors.setdefault(phase, palette[len(colors) % len(palette)])
            by_color.setdefault(color, []).append((start * 1e6, (end - start) * 1e6))
        for color, bars in by_color.items():
            axes.broken_barh(bars, (y - 0.4, 0.8), facecolors=color, edgecolors="none")
    axes.set_yticks(range(len(shown)), [name for name, _ in shown], fontsize="small")
    axes.set_ylim(len(shown) - 0.5, -0.5)
    axes.set_xlim(0, max(result.time * 1e6, 1e-9))
    axes.set_xlabel("simulated time (us)")
    axes.grid(True, axis="x", alpha=0.3)
    handles = [Patch(color=color, label=phase) for phase, color in colors.items()]
    if handles:
        figure.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5),
                      fontsize="small")
    if len(rows) > len(shown):
        title += f" (first {len(shown)} of {len(rows)} rows)"
    figure.suptitle(title.strip() or "timeline")
    return figure


def bucket_sweep_figure(reports: Sequence[StepReport], title: str = "") -> Figure:
    """Step time and exposed communication (ms) against the DDP bucket cap (log axis)."""
    figure = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    caps = [r.bucket_cap or 0 for r in reports]
    axes.plot(caps, [r.step * 1e3 for r in reports], marker="o", label="step")
    axes.plot(caps, [r.exposed * 1e3 for r in reports], marker="s", linestyle="--",
              label="exposed communication")
    axes.plot(caps, [r.compute * 1e3 for r in reports], linestyle=":", color="gray",
              label="compute")
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: size_label(x)))
    axes.set_xlabel("bucket cap")
    axes.set_ylabel("time (ms)")
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.suptitle(title or "DDP bucket cap sweep")
    return figure


def memory_figure(report: FSDPReport, title: str = "") -> Figure:
    """Memory held (MiB) over the step, on the rank whose footprint peaks highest, with the
    peak and the footprint without sharding marked."""
    figure = Figure(figsize=(10, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    times = [t * 1e3 for t, _ in report.memory] + [report.step * 1e3]
    held = [b / 2**20 for _, b in report.memory]
    if held:
        axes.step(times, held + held[-1:], where="post", label="held")
    axes.axhline(report.peak_memory / 2**20, color="C1", linestyle="--",
                 label=f"peak {report.peak_memory / 2**20:.0f} MiB")
    axes.set_xlabel("time (ms)")
    axes.set_ylabel("parameters and gradients (MiB)")
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.suptitle(title or "FSDP memory over one step")
    return figure


def samples_figure(samples: Mapping[str, Sequence[float]], title: str = "") -> Figure:
    """A histogram of each series of times (seconds; one panel each, keyed by a label such
    as a size), with the median and the 90th and 99th percentiles marked."""
    if not samples:
        raise ValueError("no samples to draw")
    figure = Figure(figsize=(8, 2.6 * len(samples) + 0.6), layout="constrained")
    FigureCanvasAgg(figure)
    panels = figure.subplots(len(samples), 1, squeeze=False)[:, 0]
    for axes, (label, times) in zip(panels, samples.items()):
        ms = np.asarray(times) * 1e3
        axes.hist(ms, bins=min(50, max(5, len(ms) // 4)), color="C0", alpha=0.8)
        for q, style in ((50, "-"), (90, "--"), (99, ":")):
            value = float(np.percentile(ms, q))
            axes.axvline(value, color="C1", linestyle=style, label=f"p{q} {value:.3f} ms")
        axes.set_title(label, fontsize="medium")
        axes.set_xlabel("time (ms)")
        axes.set_ylabel("samples")
        axes.legend(fontsize="small")
    figure.suptitle(title or f"{sum(map(len, samples.values()))} samples")
    return figure
