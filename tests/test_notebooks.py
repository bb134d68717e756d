"""The notebooks run top to bottom (small sizes), outputs and figures included."""

from __future__ import annotations

from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"


def _execute(name: str, parameters: dict[str, object], tmp_path: Path):
    notebook = jupytext.read(NOTEBOOKS / name)
    cell = next(c for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
    cell.source += "\n" + "\n".join(f"{k} = {v!r}" for k, v in parameters.items())
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    return notebook


@pytest.mark.alone  # real runs
def test_sim_vs_hardware_notebook(tmp_path):
    notebook = _execute("03_sim_vs_hardware.py", {"UPDATES": 3000, "OUT": str(tmp_path / "nb")},
                        tmp_path)
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2
    conclusion = notebook.cells[-1].outputs[0]["data"]["text/markdown"]
    assert "predicts k = 3" in conclusion and "Targets met:" in conclusion


def test_theorem_notebook(tmp_path):
    notebook = _execute("02_theorem.py", {"SEEDS": 4, "SWEEP_SEEDS": 2, "POINTS": 4}, tmp_path)
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) == 2
    conclusion = notebook.cells[-1].outputs[0]["data"]["text/markdown"]
    assert "lock-free scenario" in conclusion and "verdict" in conclusion


def test_scenarios_notebook(tmp_path):
    notebook = _execute("01_scenarios.py", {"UPDATES": 600, "THREADS": (1, 4, 16),
                                            "RATIOS": (0.1, 0.8)}, tmp_path)
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) == 3
    conclusion = notebook.cells[-1].outputs[0]["data"]["text/markdown"]
    assert "dense model's updates carry a gradient error" in conclusion


@pytest.mark.alone  # real runs
def test_your_model_notebook(tmp_path):
    """Notebook 04 walks the digits convnet example through simulate, check, real,
    calibrate and compare; its conclusion is computed from the run."""
    model = f"{NOTEBOOKS.parent / 'examples' / 'digits_convnet.py'}:make"
    notebook = _execute("04_your_model.py", {"MODEL": model, "UPDATES": 1500,
                                             "OUT": str(tmp_path / "nb")}, tmp_path)
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) == 2
    conclusion = notebook.cells[-1].outputs[0]["data"]["text/markdown"]
    assert "carried a gradient error" in conclusion and "condition (4) fails" in conclusion
    assert "targets met:" in conclusion


@pytest.mark.alone  # real runs
def test_protocols_notebook(tmp_path):
    """Notebook 05 runs every protocol for real and simulated, side by side, on shared
    memory (block ADMM on a process per stage) and on the parameter server (Sandblaster with
    the server its coordinator)."""
    notebook = _execute("05_protocols.py", {"UPDATES": 1200}, tmp_path)
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) == 1
    table = next(o["data"]["text/markdown"] for o in outputs
                 if "text/markdown" in o.get("data", {}) and "| protocol |" in
                 o["data"]["text/markdown"])
    assert all(f"| {p} |" in table for p in ("serial", "lockfree", "minibatch", "roundrobin",
                                             "staleness_lr", "dcasgd", "admm", "block_admm",
                                             "ps", "ps dcasgd rule", "ps lock-free",
                                             "ps backup workers", "ps pool of 2", "ps admm",
                                             "ps sandblaster"))
    conclusion = notebook.cells[-1].outputs[0]["data"]["text/markdown"]
    assert "synchronous minibatch's" in conclusion and "within 2×" in conclusion
