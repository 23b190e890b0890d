"""docs/python.md's quick start runs as written (an engine engineer pastes it)."""

import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def test_quick_start_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert blocks, "docs/python.md has no python block"
    exec(compile(blocks[0], str(DOC), "exec"), {})
    rate, n_events = capsys.readouterr().out.split()
    assert float(rate) > 0 and int(n_events) > 0
