"""The README's snippets are the tested ones: the Python quick start runs here, and the C++
consumer snippets are the files of tests/consumer (which ctest cmake_package_consumer builds)."""

from __future__ import annotations

import pathlib
import re
from typing import Dict

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def snippets() -> Dict[str, str]:
    """Each `<!-- snippet: NAME ... -->` marker of README.md with the fenced block after it."""
    text = (ROOT / "README.md").read_text()
    pattern = re.compile(r"<!-- snippet: (\S+(?: \S+)*?)(?: \(.*?\))? -->\n```\w*\n(.*?)```", re.S)
    return {m.group(1): m.group(2) for m in pattern.finditer(text)}


def test_readme_has_the_snippets() -> None:
    assert set(snippets()) == {
        "python quick start",
        "tests/consumer/CMakeLists.txt",
        "tests/consumer/main.cpp",
    }


@pytest.mark.parametrize("name", ["tests/consumer/CMakeLists.txt", "tests/consumer/main.cpp"])
def test_consumer_snippets_are_the_built_files(name: str) -> None:
    assert snippets()[name] == (ROOT / name).read_text()


def test_python_quick_start_runs(capsys: pytest.CaptureFixture) -> None:
    namespace: Dict[str, object] = {}
    exec(compile(snippets()["python quick start"], "README.md quick start", "exec"), namespace)
    y, out, x = namespace["y"], namespace["out"], namespace["x"]
    assert y.shape == x.shape and out.shape == x.shape  # type: ignore[attr-defined]
    assert not y.isnan().any() and not out.isnan().any()  # type: ignore[attr-defined]
    printed = capsys.readouterr().out
    assert "chosen:" in printed and "deepseek-v3" in printed
