"""Sweeps: grid planning, executors, resuming, and bad input."""

import json
import shutil
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

from simulator.engine import Engine
from simulator.errors import AsyngradError, ScenarioError
from simulator.metrics import summarize
from simulator.sweep import Axis, parse_axis, plan_sweep, run_sweep

BASE = ["run.updates=200"]
AXES = [Axis("run.threads", ("1", "4")), Axis("run.write_mode", ("load_store", "atomic_add"))]


def test_axis_syntax():
    """Comma lists and TOML arrays both work; strings in arrays keep their quotes."""
    assert parse_axis("run.threads=1, 2,8") == Axis("run.threads", ("1", "2", "8"))
    assert parse_axis("run.protocol=['locked', 'lockfree']").values == ('"locked"',
                                                                         '"lockfree"')
    for bad in ("run.threads", "=1,2", "run.threads=", "run.threads=1,,2", "x=[1,"):
        with pytest.raises(ScenarioError):
            parse_axis(bad)


def test_plan_is_the_row_major_product():
    """Cells enumerate the grid's product, last axis fastest, each with its scenario."""
    cells = plan_sweep(None, BASE, AXES)
    assert [c.values for c in cells] == [("1", "load_store"), ("1", "atomic_add"),
                                        ("4", "load_store"), ("4", "atomic_add")]
    assert [(c.scenario.run.threads, c.scenario.run.write_mode) for c in cells] == [
        (1, "load_store"), (1, "atomic_add"), (4, "load_store"), (4, "atomic_add")]


def test_a_bad_cell_fails_the_plan():
    """An invalid value anywhere in the grid is found before anything runs."""
    with pytest.raises(ScenarioError, match=r"run\.threads"):
        plan_sweep(None, BASE, [Axis("run.threads", ("2", "-1"))])
    with pytest.raises(ScenarioError, match="twice"):
        plan_sweep(None, BASE, [Axis("run.seed", ("1",)), Axis("run.seed", ("2",))])


def test_cells_equal_standalone_runs(tmp_path):
    """A cell's summary is exactly the summary of simulating its scenario alone."""
    cells = plan_sweep(None, BASE, AXES)
    rows, ran = run_sweep(cells, AXES, tmp_path)
    assert ran == 4 and len(rows) == 4
    engine = Engine(cells[2].scenario)
    alone = summarize(engine.run(), engine.problem, cells[2].scenario)
    saved = json.loads((tmp_path / "cells" / "0002" / "summary.json").read_text())
    assert saved == json.loads(json.dumps(alone))
    assert rows[2]["lost_blocks"] == alone["overwrites"]["lost_blocks"] > 0
    assert rows[3]["lost_blocks"] == 0  # atomic_add


def test_process_pool_gives_the_same_table(tmp_path):
    """Cells run in worker processes give a byte-identical table."""
    cells = plan_sweep(None, BASE, AXES)
    run_sweep(cells, AXES, tmp_path / "here")
    with ProcessPoolExecutor(max_workers=2) as pool:
        run_sweep(cells, AXES, tmp_path / "pool", pool)
    assert ((tmp_path / "here" / "sweep.csv").read_bytes()
            == (tmp_path / "pool" / "sweep.csv").read_bytes())


def test_rerun_resumes_finished_cells(tmp_path):
    """A rerun runs only cells without a finished directory, and the table is unchanged."""
    cells = plan_sweep(None, BASE, AXES)
    run_sweep(cells, AXES, tmp_path)
    table = (tmp_path / "sweep.csv").read_bytes()
    assert run_sweep(cells, AXES, tmp_path)[1] == 0
    shutil.rmtree(tmp_path / "cells" / "0001")
    assert run_sweep(cells, AXES, tmp_path)[1] == 1
    assert (tmp_path / "sweep.csv").read_bytes() == table


def test_resume_refuses_a_different_scenario(tmp_path):
    """Cells of another sweep in the same directory are an error, not silently reused."""
    run_sweep(plan_sweep(None, BASE, AXES), AXES, tmp_path)
    other = plan_sweep(None, ["run.updates=300"], AXES)
    with pytest.raises(AsyngradError, match="different scenario"):
        run_sweep(other, AXES, tmp_path)


def test_cli_sweep_and_bad_grid(tmp_path):
    """`asyngrad sweep` writes the table; a bad grid value is one line, exit 2, no output."""
    ok = subprocess.run([sys.executable, "-m", "simulator.cli", "sweep", "--out",
                         str(tmp_path / "s"), "--grid", "run.threads=1,2", "--seeds", "2",
                         "--jobs", "1", "--set", "run.updates=100"],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert len((tmp_path / "s" / "sweep.csv").read_text().splitlines()) == 5
    bad = subprocess.run([sys.executable, "-m", "simulator.cli", "sweep", "--out",
                          str(tmp_path / "b"), "--grid", "run.blocks=1,0"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "run.blocks = 0" in bad.stderr and not (tmp_path / "b").exists()


def test_sweep_out_that_is_a_file_is_refused(tmp_path):
    """A file where the sweep directory should go is an error, and the file is kept."""
    out = tmp_path / "s"
    out.write_text("precious")
    with pytest.raises(AsyngradError, match="cannot hold a sweep"):
        run_sweep(plan_sweep(None, BASE, AXES), AXES, out)
    assert out.read_text() == "precious"


def test_dask_scheduler_gives_the_same_table_and_figure(tmp_path):
    """`--dask ADDRESS` runs the cells on a real Dask scheduler (an in-process one here)."""
    distributed = pytest.importorskip("distributed")
    from simulator.cli import main

    grid = ["--grid", "run.protocol=lockfree,minibatch", "--seeds", "2",
            "--set", "run.updates=150", "--quiet"]
    assert main(["sweep", "--out", str(tmp_path / "local"), "--jobs", "1", *grid]) == 0
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster:
        assert main(["sweep", "--out", str(tmp_path / "dask"), "--dask",
                     cluster.scheduler_address, *grid]) == 0
    local, dask = tmp_path / "local", tmp_path / "dask"
    assert (local / "sweep.csv").read_bytes() == (dask / "sweep.csv").read_bytes()
    assert (dask / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dask_bad_address_is_one_line(tmp_path, capsys):
    pytest.importorskip("distributed")
    from simulator.cli import main

    code = main(["sweep", "--out", str(tmp_path / "s"), "--seeds", "1", "--quiet",
                 "--dask", "tcp://127.0.0.1:9"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dask = 'tcp://127.0.0.1:9'" in err[0]


def test_sweep_figure_has_a_line_per_protocol_and_thread_count(tmp_path):
    cells = plan_sweep(None, ["run.updates=120", "metrics.curve_points=10"],
                       [Axis("run.protocol", ("lockfree", "roundrobin")),
                        Axis("run.threads", ("2", "4")), Axis("run.seed", ("0", "1"))])
    run_sweep(cells, [Axis("run.protocol", ("lockfree", "roundrobin")),
                      Axis("run.threads", ("2", "4")), Axis("run.seed", ("0", "1"))],
              tmp_path)
    from simulator.plots import sweep_figure
    from simulator.sweep import _curve

    groups: dict = {}
    for cell in cells:
        groups.setdefault(cell.values[:2], []).append(_curve(tmp_path / "cells" / cell.name))
    fig = sweep_figure(groups, ["run.protocol", "run.threads"])
    axes = fig.axes
    assert len(axes) == 4  # (time, gradients) × (threads 2, threads 4)
    assert all(len(ax.get_lines()) == 2 for ax in axes)  # one per protocol
    # The gradients axis ends at the run's 120 gradients for every line.
    bottom = [line for ax in axes[2:] for line in ax.get_lines()]
    assert [line.get_xdata()[-1] for line in bottom] == [120] * 4
    assert (tmp_path / "sweep.png").is_file()
