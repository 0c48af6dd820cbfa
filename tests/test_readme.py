"""The README's examples must keep working: run them against a broker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.leveret_only
def test_the_ten_line_pika_example_runs(leveret_broker, capsys):
    block = next(b for b in _python_blocks() if "basic_get" in b)
    assert len(block.strip().splitlines()) <= 10
    code = block.replace("amqp://guest:guest@127.0.0.1:5672/%2F", leveret_broker)
    exec(compile(code, "README.md", "exec"), {})
    assert "Hello, Leveret!" in capsys.readouterr().out


def test_readme_commands_match_ci():
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    command = 'pip install -e ".[test,spark]" && python -m pytest'
    assert command in text and command in ci
