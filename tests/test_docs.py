"""The documentation and what it cites: README's size, the results files, links, the
test command CI runs, and the maintained benchmarks (each runs its --help)."""

import argparse
import ast
import re
import runpy
import sys
from pathlib import Path

import pytest

from mlx_lm_turbo.attach.options import add_options

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
# A results file as the docs cite it: its path from the repository's root.
CITED = re.compile(r"benchmarks/results/[\w./-]+\.\w+")
# A results file's name as measurements name theirs (device or place, maybe a commit).
RESULT_NAME = re.compile(r"\w+_(h100|h200|cpu|offline)(_\w+)?\.(md|json|txt|png)\b")


def cited():
    return {m for doc in DOCS for m in CITED.findall(doc.read_text())}


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text()) <= 10_000


def test_every_cited_results_file_exists():
    missing = sorted(p for p in cited() if not (ROOT / p).is_file())
    assert not missing


def test_every_results_file_is_cited():
    files = {p.relative_to(ROOT).as_posix() for p in RESULTS.rglob("*") if p.is_file()}
    assert files, "benchmarks/results/ is empty"
    assert not sorted(files - cited())


def test_the_package_names_no_results_file():
    named = set()
    for path in (ROOT / "mlx_lm_turbo").rglob("*"):
        if path.is_file() and path.suffix in {".py", ".cu", ".cuh", ".h", ".metal"}:
            text = path.read_text()
            if "benchmarks/results" in text or RESULT_NAME.search(text):
                named.add(path.relative_to(ROOT).as_posix())
    assert not sorted(named)


def slug(heading):
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_to_files_and_headings_exist(doc):
    text = doc.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        assert linked.exists(), target
        if anchor:
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
            assert anchor in {slug(h) for h in headings}, target


def test_ci_runs_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = next(
        line.strip()
        for line in readme.splitlines()
        if line.strip().startswith("python3 -m pip install -q -e")
    )
    assert command in ci


def test_the_start_up_hook_knows_every_option_the_plugin_adds():
    # Read from the file, not imported: the interpreter has already run its installed copy.
    hook = ast.parse((ROOT / "mlx_lm_turbo_autoload.py").read_text())
    options = next(
        ast.literal_eval(node.value)
        for node in hook.body
        if isinstance(node, ast.Assign) and node.targets[0].id == "OPTIONS"
    )
    parser = argparse.ArgumentParser()
    add_options(parser)
    added = {
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }
    assert added == set(options)


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_each_benchmark_runs_its_help(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))
    with pytest.raises(SystemExit) as exit:
        runpy.run_path(str(script), run_name="__main__")
    assert exit.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_about_six_benchmarks_are_maintained():
    assert len(BENCHMARKS) <= 7
