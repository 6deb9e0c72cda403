"""``simcomm sweep`` and ``simcomm plot``: the CSV rows, valid PNGs drawn on Agg, the
crossover table against the alpha-beta closed forms, the same CSV on 1 or 2 processes,
measured results beside simulated ones, and mistakes (exit 2, one line)."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from algorithms import alltoall_allreduce
from algorithms.harness.bench import CSV_HEADER
from simcomm import SizeOnly, simulate, switch
from simcomm.cli import main
from simcomm.crossover import Crossover, crossovers
from simcomm.plots import figure_groups, sweep_figure
from simcomm.sweep import Grid, run_sweep, split_list
from simcomm.sweep_csv import SWEEP_HEADER, read_bench_csv, read_csv

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
P, B, R = 4, 1e11, 4e10  # ranks, link bandwidth (bytes/s), reduce bandwidth (bytes/s)
LATENCIES = {"1us": 1e-6, "5us": 5e-6}
CROSSOVER_SIZES = [16 * 1024, 64 * 1024, 256 * 1024, 512 * 1024, 1024**2, 4 * 1024**2]

# Closed forms on a fully connected topology (see tests/test_cli.py), n bytes, latency a.
CLOSED_FORMS = {
    "ring_allreduce": lambda n, a: 2 * (P - 1) * (a + n / (P * B)) + (P - 1) * (n / P) / R,
    "reduce_broadcast_allreduce": lambda n, a: 2 * (a + n / B) + (P - 1) * n / R,
    "alltoall_allreduce": lambda n, a: max(n / R, a + n / B) + (P - 1) * n / R,
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000, path


SMALL = ["--algorithm", "ring_allreduce,alltoall_allreduce", "--sizes", "4KiB,1MiB",
         "--topology", "switch,dgx-a100", "--ranks", "4", "--latency", "1us,5us"]


def test_sweep_writes_rows_plots_and_crossovers(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    status, out, err = run(capsys, "sweep", *SMALL, "--jobs", "1", "--out", str(tmp_path))
    assert status == 0 and err == ""  # no progress bar: stderr is not a terminal here
    text = (tmp_path / "sweep.csv").read_text()
    assert text.splitlines()[0] == SWEEP_HEADER
    rows = list(csv.DictReader(io.StringIO(text)))
    settings = [(r["topology"], r["ranks"], r["bandwidth"], r["latency"], r["algorithm"],
                 r["size"]) for r in rows]
    assert settings == [
        ("switch", "4", "100GB/s", latency, algorithm, size)
        for latency in ("1us", "5us") for algorithm in ("ring_allreduce", "alltoall_allreduce")
        for size in ("4096", "1048576")
    ] + [("dgx-a100", "8", "", "", algorithm, size)
         for algorithm in ("ring_allreduce", "alltoall_allreduce")
         for size in ("4096", "1048576")]
    expected = simulate(alltoall_allreduce, [SizeOnly(2**18)] * 4, switch(4, B, 5e-6),
                        record=False)
    assert float(rows[7]["time_us"]) == expected.time * 1e6
    assert {r["wrong"] for r in rows} == {"N/A"}
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["sweep_4ranks_100GBps_1us.png", "sweep_4ranks_100GBps_5us.png",
                    "sweep_8ranks.png"]
    for name in pngs:
        assert_png(tmp_path / name)
    table = (tmp_path / "crossover.md").read_text()
    assert table in out and out.startswith("simulated 12 points in ")
    # On the DGX A100's NVSwitch the whole-buffer all-to-all (one latency, 7 n/B through
    # each GPU's links) still beats the ring (14 latencies) at 1 MiB.
    assert "| dgx-a100 | 8 | (own) | (own) | 4KiB - 1MiB | alltoall_allreduce |" in table


def expected_crossovers(latency: str) -> list[tuple[int, int, str]]:
    """Runs of sizes won by one algorithm, from the closed forms."""
    runs: list[list] = []
    for n in CROSSOVER_SIZES:
        times = {name: form(n, LATENCIES[latency]) for name, form in CLOSED_FORMS.items()}
        winner = min(times, key=times.get)
        if runs and runs[-1][2] == winner:
            runs[-1][1] = n
        else:
            runs.append([n, n, winner])
    return [tuple(run) for run in runs]


def test_crossover_table_matches_the_closed_forms(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    status, out, _ = run(
        capsys, "sweep", "--topology", "fully_connected", "--ranks", str(P),
        "--latency", ",".join(LATENCIES), "--reduce-bandwidth", "40GB/s",
        "--sizes", ",".join(map(str, CROSSOVER_SIZES)), "--jobs", "1", "--no-plots",
        "--out", str(tmp_path))
    assert status == 0
    rows = read_csv(tmp_path / "sweep.csv")
    for row in rows:
        assert row.time_us == pytest.approx(
            CLOSED_FORMS[row.algorithm](row.size, LATENCIES[row.latency]) * 1e6, rel=1e-12)
    table = crossovers(rows)
    for latency in LATENCIES:
        got = [(c.first_size, c.last_size, c.winner) for c in table if c.latency == latency]
        assert got == expected_crossovers(latency)
    # all-to-all wins while latency dominates; the crossover moves up with the latency
    assert expected_crossovers("1us")[0] == (16384, 65536, "alltoall_allreduce")
    assert expected_crossovers("5us")[0] == (16384, 262144, "alltoall_allreduce")
    assert ("| fully_connected | 4 | 100GB/s | 5us | 512KiB - 4MiB | ring_allreduce |"
            in out.splitlines())


def test_crossover_ties_and_collectives_are_kept_apart() -> None:
    rows = run_sweep(Grid(algorithms=("broadcast", "broadcast:tree=true", "all_gather"),
                          sizes=(0, 4096), ranks=(2,)).points())
    table = crossovers(rows)
    # on 2 ranks the flat and the tree broadcast are the same single message
    assert table == [
        Crossover("broadcast", "switch", 2, "100GB/s", "5us", 0, 4096,
                  "broadcast = broadcast:tree=true"),
        Crossover("allgather", "switch", 2, "100GB/s", "5us", 0, 4096, "all_gather"),
    ]


def test_two_jobs_write_the_same_csv_as_one(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    outputs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}"
        assert run(capsys, "sweep", *SMALL, "--jobs", jobs, "--no-plots", "--out",
                   str(out))[0] == 0
        outputs.append((out / "sweep.csv").read_bytes())
    assert outputs[0] == outputs[1] and outputs[0].count(b"\n") == 13


def test_progress_bar_on_request(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, _, err = run(capsys, "sweep", "--sizes", "1KiB,2KiB", "--jobs", "2", "--progress",
                         "--no-plots", "--out", str(tmp_path))
    assert status == 0
    assert "sweep: 100%" in err and "6/6" in err.split("\r")[-1]


def test_plot_from_csv_with_measured_results(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    sweep_dir, plot_dir = tmp_path / "sweep", tmp_path / "plot"
    assert run(capsys, "sweep", "--sizes", "64KiB,1MiB,16MiB", "--jobs", "1", "--no-plots",
               "--out", str(sweep_dir))[0] == 0
    # A measured file has the bench columns, as realcomm bench --format csv prints them.
    status, measured, _ = run(capsys, "bench", "--algorithm", "ring_allreduce", "--topology",
                              "switch", "--ranks", "8", "--bandwidth", "80GB/s", "--latency",
                              "10us", "--sizes", "64KiB,1MiB,16MiB", "--format", "csv")
    assert status == 0 and measured.splitlines()[0] == CSV_HEADER
    (tmp_path / "gloo.csv").write_text(measured)
    status, out, _ = run(capsys, "plot", str(sweep_dir / "sweep.csv"), "--measured",
                         f"gpu box={tmp_path / 'gloo.csv'}", "--out", str(plot_dir))
    assert status == 0
    assert (plot_dir / "crossover.md").read_text() == (sweep_dir / "crossover.md").read_text()
    assert_png(plot_dir / "sweep_8ranks_100GBps_5us.png")
    (series,) = read_bench_csv(tmp_path / "gloo.csv", "gpu box")
    assert series.sizes == (65536, 2**20, 2**24) and series.label == "gpu box"
    (simulated,) = figure_groups(read_csv(sweep_dir / "sweep.csv")).values()
    figure = sweep_figure("check", simulated, [series])
    assert isinstance(figure.canvas, FigureCanvasAgg)
    time_axes, busbw_axes = figure.axes
    assert [line.get_label() for line in time_axes.get_lines()] == [
        "ring_allreduce", "reduce_broadcast_allreduce", "alltoall_allreduce", "gpu box"]
    measured_line = time_axes.get_lines()[-1]
    assert list(measured_line.get_ydata()) == list(series.time_us)
    assert measured_line.get_linestyle() == ":"
    status, out, _ = run(capsys, "plot", "--measured", str(tmp_path / "gloo.csv"), "--out",
                         str(tmp_path / "only"))
    assert status == 0 and "crossover" not in out
    assert_png(tmp_path / "only" / "sweep_measured.png")


def test_split_list_keeps_parameters_with_their_name() -> None:
    assert split_list("switch, fattree-h100:nodes=8,nodes_per_leaf=2,dgx-a100") == [
        "switch", "fattree-h100:nodes=8,nodes_per_leaf=2", "dgx-a100"]
    assert split_list("reduce:tree=true,root=1,ring_allreduce") == [
        "reduce:tree=true,root=1", "ring_allreduce"]
    with pytest.raises(ValueError, match="names nothing"):
        split_list(" , ")


def test_sweep_runs_headless_without_pyplot(tmp_path: Path) -> None:
    code = ("import sys; from simcomm.cli import main; "
            f"status = main(['sweep', '--sizes', '1KiB', '--out', {str(tmp_path)!r}]); "
            "assert 'matplotlib.pyplot' not in sys.modules; sys.exit(status)")
    headless = {key: value for key, value in os.environ.items()
                if key not in ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=headless)
    assert done.returncode == 0, done.stderr
    assert_png(tmp_path / "sweep_8ranks_100GBps_5us.png")


BAD = [
    (["--algorithm", "ring_alreduce"], "algorithm 'ring_alreduce': unknown algorithm"),
    (["--algorithm", "reduce_broadcast_allreduce:trees=true"], "has no such parameter"),
    (["--algorithm", "reduce_broadcast_allreduce:root=8"], "is not a rank of a world of 8"),
    (["--sizes", "1KiBB"], "unknown size unit"),
    (["--sizes", "1KiB", "-b", "1K"], "either --sizes or -b/-e/-f"),
    (["-f", "1"], "-f/--stepfactor must be an int >= 2"),
    (["--jobs", "0"], "--jobs must be >= 1, got 0"),
    (["--ranks", "4,x"], "--ranks: 'x' is not an int"),
    (["--ranks", "0"], "ranks must be ints >= 1"),
    (["--bandwidth", "100GBs"], "bandwidth '100GBs': unknown bandwidth unit"),
    (["--bandwidth", "1e400GB/s"], "bandwidth '1e400GB/s' is too large"),  # ran at inf
    (["--out", ""], "argument --out: an empty path names no folder"),  # wrote into ./
    (["--latency", "5parsecs"], "--latency: unknown time unit 'parsecs' in '5parsecs'"),
    (["--latency", "5us,1"], "--latency: time '1' has no unit: write 1s, 1ms, 1us or 1ns"),
    (["--algorithm", ""], "--algorithm: '' names nothing"),
    (["--topology", ","], "--topology: ',' names nothing"),
    (["--topology", "torus"], "unknown topology 'torus'"),
    (["--topology", "hierarchical", "--ranks", "12"], "12 ranks do not fill nodes of 8"),
    (["--topology", "dgx-a100", "--ranks", "4"], "--ranks applies only to the builder"),
    (["--measured", "nowhere.csv"], "cannot read 'nowhere.csv'"),
    (["--measured", "=x.csv"], "write LABEL=FILE or FILE"),
    (["--dtype", "complex"], "unknown --dtype 'complex'"),
    # --kind used to be dropped unread when no algorithm was the user's own.
    (["--kind", "gather"], "unknown --kind 'gather'; known: allreduce"),
    (["--kind", "broadcast"], "--kind broadcast says what an algorithm of your own "
                              "(module.path:function) implements, and the sweep has none: "
                              "the built-in ones implement their own"),
]


@pytest.mark.parametrize("argv, message", BAD)
def test_sweep_mistakes_exit_2_with_one_line(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path, argv: list[str],
                                             message: str) -> None:
    full = ["sweep", "--out", str(tmp_path / "out"), *argv]
    if "--sizes" not in argv and "-f" not in argv:
        full += ["--sizes", "1KiB"]
    status, out, err = run(capsys, *full)
    assert status == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("simcomm: error: ")
    assert message in lines[0]
    assert not (tmp_path / "out").exists()  # checked before anything is written


def test_bad_csvs_exit_2_with_one_line(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    (tmp_path / "short.csv").write_text("size,time_us\n1024,3.5\n")
    (tmp_path / "text.csv").write_text(CSV_HEADER + "\n1024,256,float,sum,-1,fast,1,1,N/A\n")
    # Rows that simcomm validate refuses, which plot used to draw.
    for name, row in (("time", "1024,256,float,sum,-1,-5,1,1,N/A"),
                      ("size", "-1024,256,float,sum,-1,5,1,1,N/A"),
                      ("type", "1024,256,foo,sum,-1,5,1,1,N/A")):
        (tmp_path / f"{name}.csv").write_text(f"{CSV_HEADER}\n{row}\n")
    (tmp_path / "sweep.csv").write_text(f"{SWEEP_HEADER}\nring_allreduce,switch,8,100GB/s,5us,"
                                        "-1024,256,float,sum,-1,70.0,0.01,0.02,N/A\n")
    cases = [
        (["plot", "--out", str(tmp_path)], "nothing to plot"),
        # This used to read the file, write nothing and exit 0.
        (["plot", "--measured", str(tmp_path / "short.csv"), "--no-plots", "--out",
          str(tmp_path)], "simcomm: error: nothing to do: --measured files are only drawn, "
                          "and --no-plots draws nothing; give sweep CSVs too, or leave "
                          "--no-plots out\n"),
        (["plot", str(tmp_path / "short.csv"), "--out", str(tmp_path)], "no column algorithm"),
        (["plot", "--measured", str(tmp_path / "short.csv"), "--out", str(tmp_path)],
         "no column count"),
        (["plot", "--measured", f"m={tmp_path / 'text.csv'}", "--out", str(tmp_path)],
         "text.csv line 2: time_us: expected float, got 'fast'"),
        (["plot", "--measured", str(tmp_path / "time.csv"), "--out", str(tmp_path)],
         "time.csv line 2: time_us: must be >= 0, got '-5'"),
        (["plot", "--measured", str(tmp_path / "size.csv"), "--out", str(tmp_path)],
         "size.csv line 2: size: must be >= 0, got '-1024'"),
        (["plot", "--measured", str(tmp_path / "type.csv"), "--out", str(tmp_path)],
         "type.csv line 2: type: unknown type 'foo'; known: int8"),
        (["plot", str(tmp_path / "sweep.csv"), "--out", str(tmp_path)],
         "sweep.csv line 2: size: must be >= 0, got '-1024'"),
    ]
    for argv, message in cases:
        status, _, err = run(capsys, *argv)
        assert status == 2 and len(err.splitlines()) == 1 and message in err, err


def test_a_sweep_on_a_dask_cluster_writes_the_local_pool_s_csv(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # A real dask.distributed cluster on this machine: a scheduler and two worker
    # processes, reached over TCP as a remote one would be.
    from distributed import LocalCluster
    assert run(capsys, "sweep", *SMALL, "--jobs", "2", "--no-plots", "--out",
               str(tmp_path / "pool"))[0] == 0
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        status, out, _ = run(capsys, "sweep", *SMALL, "--scheduler", cluster.scheduler_address,
                             "--no-plots", "--out", str(tmp_path / "dask"))
        # Seeded samples go to the same cluster, and come back in the order of their seeds.
        samples = ["bench", "--algorithm", "ring_allreduce", "--topology", "switch", "--ranks",
                   "4", "--bandwidth", "10GB/s", "--latency", "2us", "--sizes", "64KiB",
                   "--samples", "5", "--message-delay", "lognormal:3us,1", "--format", "csv"]
        on_dask = run(capsys, *samples, "--scheduler", cluster.scheduler_address)
    assert status == 0 and f"on the dask cluster at {cluster.scheduler_address}" in out
    assert ((tmp_path / "dask" / "sweep.csv").read_bytes()
            == (tmp_path / "pool" / "sweep.csv").read_bytes())
    local = run(capsys, *samples)
    assert on_dask[0] == local[0] == 0 and on_dask[1] == local[1]


def test_rows_reach_the_csv_as_they_finish_and_a_stopped_sweep_resumes(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run(capsys, "sweep", *SMALL, "--jobs", "1", "--no-plots", "--out",
               str(tmp_path / "whole"))[0] == 0
    whole = (tmp_path / "whole" / "sweep.csv").read_text().splitlines()
    # A sweep stopped after five rows left them in its CSV, each written as it finished.
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "sweep.csv").write_text("\n".join(whole[:6]) + "\n")
    status, out, _ = run(capsys, "sweep", *SMALL, "--jobs", "2", "--no-plots", "--resume",
                         "--out", str(stopped))
    assert status == 0 and out.startswith("simulated 7 points in ")
    assert f"; 5 kept from {stopped / 'sweep.csv'}" in out.splitlines()[0]
    assert (stopped / "sweep.csv").read_text().splitlines() == whole
    # Stopped before its first row: the header alone is nothing kept, not "no rows".
    (stopped / "sweep.csv").write_text(whole[0] + "\n")
    status, out, _ = run(capsys, "sweep", *SMALL, "--jobs", "2", "--no-plots", "--resume",
                         "--out", str(stopped))
    assert status == 0 and f"; 0 kept from {stopped / 'sweep.csv'}" in out.splitlines()[0]
    assert (stopped / "sweep.csv").read_text().splitlines() == whole
    # A second sweep into the same folder used to replace the rows there as it streamed.
    again = ["sweep", "--sizes", "1KiB", "--no-plots", "--out", str(stopped)]
    status, out, err = run(capsys, *again)
    assert status == 2 and out == ""
    assert err == (f"simcomm: error: {stopped / 'sweep.csv'} holds 12 rows already: give "
                   "--resume to keep this grid's rows, --overwrite to replace them, or "
                   "another --out\n")
    assert (stopped / "sweep.csv").read_text().splitlines() == whole
    status, out, err = run(capsys, *again, "--resume")
    assert status == 2 and "holds 12 rows of another grid, which --resume would drop" in err
    assert run(capsys, *again, "--resume", "--overwrite")[0] == 0
    assert len((stopped / "sweep.csv").read_text().splitlines()) == 4  # 3 algorithms
    assert run(capsys, *again, "--overwrite")[0] == 0
    streamed = []
    rows = run_sweep(Grid(sizes=(1024, 4096)).points(), on_row=streamed.append)
    assert sorted(streamed, key=rows.index) == rows


def test_out_must_be_a_folder_in_one_that_exists(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    # A file used to end in "[Errno 17] File exists", and a missing parent was made.
    file = tmp_path / "file"
    file.write_text("")
    for command in (["sweep", "--sizes", "1KiB", "--no-plots"], ["plot", str(file)]):
        status, out, err = run(capsys, *command, "--out", str(file))
        assert status == 2 and out == ""
        assert err == (f"simcomm: error: argument --out: {file} exists and is not a folder: "
                       f"name a new folder or one to write into (see simcomm {command[0]} "
                       "--help)\n")
        status, _, err = run(capsys, *command, "--out", str(tmp_path / "no" / "out"))
        assert status == 2 and f"argument --out: folder {tmp_path / 'no'} does not exist" in err
    assert not (tmp_path / "no").exists()
