"""PNG plots of sweeps: time and bus bandwidth against size, one line per series.

Figures are drawn on matplotlib's Agg canvas directly, never through pyplot, so no display
is needed and nothing global (pyplot's current figure, the chosen backend) is touched; a
figure is freed like any object once it is no longer referenced. matplotlib is an optional
dependency (``pip install simcomm[plot]``); only this module imports it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator

from simcomm.sweep import Series

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
    """Write ``figure`` as a PNG, making the folder if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
