"""The README is a front page that stays true: short, every command in it one the CLI takes, its two
commands the ones CI runs, its sample output what the command prints, and a line for every policy,
exit code, notebook and docs page."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from toolkit.cli import commands
from toolkit.cli.main import main
from toolkit.cli.terminal import EXIT_INTERRUPTED, EXIT_STDOUT_CLOSED

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
BLOCK = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)  # a fenced block: its language, its text
CLI = ("python -m toolkit.cli", "python -m toolkit", "constshare")  # the ways the README calls the command line
OUTPUT = re.compile(r"<!-- output: (.+?) -->\n```\n(.*?)```\n<!-- end of output -->", re.S)


def section(text: str, heading: str) -> str:
    """The text under a ``## heading``, up to the next ``## ``."""
    start = text.index(f"\n## {heading}\n") + len(heading) + 5
    end = text.find("\n## ", start)
    return text[start : end if end >= 0 else len(text)]


def cli_commands(line: str) -> list[list[str]]:
    """The command-line calls in one shell line (after a ``$`` prompt, between ``&&``, ``|``, ``;``),
    each as the argument list the CLI's parser gets."""
    words = shlex.split(line.removeprefix("$ "), comments=True)
    calls, current = [], []
    for w in [*words, "&&"]:
        if w in ("&&", "||", "|", ";"):
            joined = " ".join(current)
            for prefix in CLI:
                if joined == prefix or joined.startswith(prefix + " "):
                    calls.append(current[len(prefix.split()) :])
                    break
            current = []
        else:
            current.append(w)
    return calls


def test_a_shell_line_gives_its_command_line_calls():
    assert cli_commands("$ python -m toolkit report a.pte --dry-run  # note") == [["report", "a.pte", "--dry-run"]]
    assert cli_commands("pip install x && constshare samples | head") == [["samples"]]
    assert cli_commands("python -m toolkit.cli scan d/") == [["scan", "d/"]]
    assert cli_commands("python -m pytest -m gpu") == []


@pytest.fixture
def parsed(monkeypatch):
    """Runs the CLI's own parser on an argument list, with every command replaced by one that only
    records its arguments: a command the parser refuses exits 2 (argparse's SystemExit)."""
    seen = []

    def record(a):
        seen.append(a)
        return 0

    for name in dir(commands):
        if name.startswith("cmd_"):
            monkeypatch.setattr(commands, name, record)

    def parse(argv: list[str]):
        seen.clear()
        try:
            code = main(argv)
        except SystemExit as e:
            pytest.fail(f"the command line refuses {shlex.join(argv)!r} (exit {e.code})")
        assert code == 0 and len(seen) == 1, argv
        return seen[0]

    return parse


def test_the_readme_is_a_front_page():
    """At most 160 lines; no line over 120 characters but table rows and a program's printed output
    (a fenced block with no language)."""
    lines = README.splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines"
    output = {i for m in BLOCK.finditer(README) if not m.group(1) for i in range(*_line_span(m))}
    long = [(i + 1, len(s)) for i, s in enumerate(lines) if len(s) > 120 and not s.startswith("|") and i not in output]
    assert not long, f"README.md lines over 120 characters (line, length): {long}"


def _line_span(m: re.Match) -> tuple[int, int]:
    return README.count("\n", 0, m.start()), README.count("\n", 0, m.end()) + 1


def test_every_command_in_the_readme_and_the_docs_is_one_the_command_line_takes(parsed, capsys):
    """Every call of the command line in a code block of the README or docs/, and in the README's
    inline code, parses; every ``--flag`` the README names in code is an option of some command."""
    pages = {"README.md": README, **{f"docs/{p.name}": p.read_text(encoding="utf-8") for p in REPO.glob("docs/*.md")}}
    calls = []
    for page, text in pages.items():
        for m in BLOCK.finditer(text):
            shell = m.group(1) in ("bash", "sh")  # every line a command; in printed output, its "$ " lines
            lines = [s for s in m.group(2).splitlines() if shell or s.startswith("$ ")]
            calls += [(page, c) for line in lines for c in cli_commands(line)]
    spans = [s for s in re.findall(r"`([^`\n]+)`", README) if s.startswith(CLI)]
    calls += [("README.md", c) for span in spans for c in cli_commands(span)]
    assert len({shlex.join(c) for _, c in calls}) >= 8, calls  # the README's and the user guide's examples
    for page, argv in calls:
        a = parsed(argv)
        assert a.cmd == argv[0], (page, argv)

    with pytest.raises(SystemExit):
        main(["--help"])
    (names,) = re.findall(r"\{([a-z,]+)\}", capsys.readouterr().out.split("\n\n")[0])
    helps = []
    for cmd in names.split(","):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        helps.append(capsys.readouterr().out)
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", "\n".join(helps)))
    named = set(re.findall(r"`(--[a-z][a-z-]*)", README))
    assert named and not named - flags, f"README.md names flags no command takes: {named - flags}"


def test_the_two_commands_are_the_ones_ci_runs():
    """CI (.ci/run) installs what the README's install command installs and runs its test command."""
    install, test = [m.group(2).strip() for m in BLOCK.finditer(section(README, "Two commands"))][:2]
    assert test == "python -m pytest"
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    ci_lines = [line.strip() for line in ci.splitlines() if not line.lstrip().startswith("#")]
    assert test in ci_lines
    installs = [s.strip() for s in install.split("&&") if s.strip().startswith("pip install")]
    assert len(installs) == 2, install
    for step in installs:
        packages = step.removeprefix("pip install").strip()
        assert f"python -m pip install -q {packages}" in ci_lines, f".ci/run does not install {packages}"


def test_the_sample_output_is_what_the_command_prints(capsys):
    """The README's sample output is the command's real output (refresh the block by running its
    ``$`` line when the output changes), with the exit code the text before it names."""
    blocks = OUTPUT.findall(README)
    assert [name for name, _ in blocks] == ["report shared_ok"]
    for _, block in blocks:
        first, _, shown = block.partition("\n")
        (argv,) = cli_commands(first)
        code = main(argv)
        printed = capsys.readouterr().out
        assert [s.rstrip() for s in printed.strip("\n").splitlines()] == shown.strip("\n").splitlines()
        before = README[: README.index(first)]
        assert int(re.findall(r"exit (\d+)", before)[-1]) == code


def test_every_policy_has_its_one_line_and_every_exit_code_its_row():
    from toolkit.core.policies import POLICY_CLASSES
    from toolkit.core.policies.releases import executorch_releases
    from toolkit.core.verdict import EXIT_CODE_MEANINGS

    table = README[README.index("<!-- policy table -->") : README.index("<!-- end of policy table -->")]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z-]+)` \|[^|\n]*\| ([^|\n]*) \|", table, re.M)}
    assert sorted(rows) == sorted(p.value for p in POLICY_CLASSES) and table.count("\n| `") == len(rows)
    for name, releases in rows.items():  # the releases as releases.py says them
        assert releases == executorch_releases(name), name
    codes = section(README, "Exit codes")
    for code, meaning in EXIT_CODE_MEANINGS.items():
        assert f"| {int(code)} | {meaning} |" in codes
    for code in (EXIT_INTERRUPTED, EXIT_STDOUT_CLOSED):
        assert re.search(rf"^\| {code} \| \S", codes, re.M), code


def test_every_notebook_and_every_docs_page_has_its_line():
    notebooks = re.findall(r"\]\((notebooks/[^)]+\.ipynb)\)", section(README, "Notebooks"))
    assert sorted(notebooks) == sorted(f"notebooks/{p.name}" for p in REPO.glob("notebooks/*.ipynb"))
    docs = section(README, "Documentation").strip().splitlines()
    linked = [re.fullmatch(r"- \[[^\]]+\]\((docs/[\w-]+\.md)\): .+", line) for line in docs]
    assert all(linked), docs
    assert sorted(m.group(1) for m in linked) == sorted(f"docs/{p.name}" for p in REPO.glob("docs/*.md"))
    assert "](docs/shared_cache.svg)" in section(README, "What goes wrong, and why")


def refreshed(text: str) -> str:
    """``text`` with each output block's printed lines replaced by what its ``$`` line prints now."""
    import contextlib
    import io

    def run(m: re.Match) -> str:
        first = m.group(2).partition("\n")[0]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(cli_commands(first)[0])
        return f"<!-- output: {m.group(1)} -->\n```\n{first}\n{out.getvalue().rstrip()}\n```\n<!-- end of output -->"

    return OUTPUT.sub(run, text)


if __name__ == "__main__":  # python tests/test_readme.py: refresh the README's sample output in place
    (REPO / "README.md").write_text(refreshed(README), encoding="utf-8")
