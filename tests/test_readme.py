"""The README's Python example runs as written (in a fresh folder, as a script)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def test_readme_python_example_replays_to_a_run_directory(tmp_path: Path) -> None:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    (script,) = [b for b in blocks if "replayer.launch" in b]
    assert len(script.strip().splitlines()) <= 15
    res = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "ok" in res.stdout
    df = pd.read_parquet(tmp_path / "runs" / "from-python" / "requests")
    assert len(df) > 0
    assert (df["status"] == "ok").all()
