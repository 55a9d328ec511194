"""Tier 1: the generated diagrams and docs match the transition table, and staleness is detected. No Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import plaita.fsm.diagram as diagram
import plaita.fsm.table as table
from plaita.fsm import Lifecycle, State

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = {
    "diagrams/worker.mmd": diagram.render_mermaid,
    "diagrams/worker.dot": diagram.render_dot,
    "docs/states.md": diagram.render_states_md,
}
#: transitions' own tests/test_mermaid.py parses edges with this regex.
MERMAID_EDGE = re.compile(r"^\s+(?P<src>\w+)\s*-->\s*(?P<dst>\w+)\s*:\s*(?P<attr>.*)$")
DOT_EDGE = re.compile(r'^\s+(?P<src>\w+) -> (?P<dst>\w+) \[label="(?P<attr>[^"]*)"(?P<rest>[^\]]*)\];$')
LABEL = re.compile(r"^(?P<trigger>\w+)(?: \[(?P<cond>\w+)\])?$")
README_STUB = "# plaita\n\nIntro.\n\n" + diagram.README_BEGIN + "\nold\n" + diagram.README_END + "\n\nMore.\n"

Edge = tuple[str, str, str, str | None]


def _machine_edges() -> set[Edge]:
    """(source, dest, trigger, condition) for every non-internal transition of the runtime machine."""
    machine = Lifecycle().machine
    out: set[Edge] = set()
    for name, event in machine.events.items():
        for src, transitions in event.transitions.items():
            for t in transitions:
                if t.dest is None:
                    continue
                conds = [c.func for c in t.conditions]
                assert len(conds) <= 1
                out.add((src, t.dest, name, conds[0] if conds else None))
    return out


def _table_edges() -> set[Edge]:
    return {(s.name, d.name, t, c) for s, t, d, c in table.edges() if d is not None}


def _parse_label(attr: str) -> tuple[str, str | None]:
    m = LABEL.match(attr)
    assert m is not None, attr
    return m["trigger"], m["cond"]


def _mermaid_edges(text: str) -> list[Edge]:
    out = []
    for line in text.splitlines():
        if (m := MERMAID_EDGE.match(line)) is not None:
            out.append((m["src"], m["dst"], *_parse_label(m["attr"])))
    return out


def _plant_tree(root: Path, *, readme: bool = True) -> None:
    """A tmp project root holding freshly generated files (and a README with diagram markers)."""
    if readme:
        (root / "README.md").write_text(README_STUB, encoding="utf-8")
    diagram.write_files(root)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "plaita", "diagram", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


class TestCommittedFiles:
    """The files in the repository are what the table generates today."""

    def test_no_stale_files(self) -> None:
        """stale_files() on the repository root is empty."""
        assert diagram.stale_files(ROOT) == []

    @pytest.mark.parametrize("relpath", sorted(COMMITTED))
    def test_committed_file_equals_regenerated(self, relpath: str) -> None:
        """The committed file is byte-identical to the in-memory rendering."""
        assert (ROOT / relpath).read_text(encoding="utf-8") == COMMITTED[relpath]()

    def test_readme_block_is_current(self) -> None:
        """README.md embeds the current Mermaid block between its markers."""
        readme = ROOT / "README.md"
        if not readme.exists():
            pytest.skip("README.md not written yet")
        text = readme.read_text(encoding="utf-8")
        assert diagram.render_readme_block() in text
        assert diagram.splice_readme(text) == text


class TestNormalisation:
    """Generated text survives the whitespace pre-commit hooks unchanged and carries no live-state styling."""

    @pytest.mark.parametrize(
        "render",
        [diagram.render_mermaid, diagram.render_dot, diagram.render_states_md, diagram.render_readme_block],
        ids=["mermaid", "dot", "states_md", "readme_block"],
    )
    def test_normalised(self, render: object) -> None:
        """No trailing whitespace, no CR, no tabs, no s_active/s_previous/Class/classDef styling."""
        assert callable(render)
        text = render()
        assert isinstance(text, str)
        for line in text.splitlines():
            assert line == line.rstrip(), repr(line)
        assert "\r" not in text and "\t" not in text
        for styling in ("s_active", "s_previous", "Class ", "classDef"):
            assert styling not in text

    @pytest.mark.parametrize(
        "render",
        [diagram.render_mermaid, diagram.render_dot, diagram.render_states_md],
        ids=["mermaid", "dot", "states_md"],
    )
    def test_single_final_newline(self, render: object) -> None:
        """Each generated file ends with exactly one newline."""
        assert callable(render)
        text = render()
        assert text.endswith("\n") and not text.endswith("\n\n")

    def test_mermaid_front_matter_is_yaml(self) -> None:
        """The Mermaid front matter is a YAML ``title:`` (not transitions' bare title) before stateDiagram-v2."""
        lines = diagram.render_mermaid().splitlines()
        assert lines[:4] == ["---", f"title: {diagram.TITLE}", "---", "stateDiagram-v2"]

    def test_rendering_is_deterministic(self) -> None:
        """Rendering twice gives identical text."""
        assert diagram.render_mermaid() == diagram.render_mermaid()
        assert diagram.render_dot() == diagram.render_dot()


class TestEdges:
    """Every edge drawn is a transition of the table, and every transition is drawn once."""

    def test_mermaid_edges_equal_table(self) -> None:
        """The Mermaid edge set (transitions' regex) equals the machine's non-internal transitions."""
        drawn = _mermaid_edges(diagram.render_mermaid())
        assert len(drawn) == len(set(drawn))
        assert set(drawn) == _machine_edges() == _table_edges()

    def test_mermaid_marks_start_terminal_and_noop(self) -> None:
        """INIT is the start, STOPPED the only terminal, and the STOPPING no-op is a note, not an edge."""
        text = diagram.render_mermaid()
        assert "    [*] --> INIT" in text.splitlines()
        ends = [line for line in text.splitlines() if line.endswith("--> [*]")]
        assert ends == ["    STOPPED --> [*]"]
        assert "    note right of STOPPING: stop_requested again is a no-op" in text.splitlines()
        assert not any(src == dst for src, dst, _, _ in _mermaid_edges(text))

    def test_dot_edges_equal_table(self) -> None:
        """The DOT edges equal the machine's transitions, with the internal no-op drawn as a dotted self-loop."""
        drawn: list[Edge] = []
        noops = []
        for line in diagram.render_dot().splitlines():
            if (m := DOT_EDGE.match(line)) is None:
                continue
            if "style=dotted" in m["rest"]:
                noops.append((m["src"], m["dst"], m["attr"]))
            else:
                drawn.append((m["src"], m["dst"], *_parse_label(m["attr"])))
        assert len(drawn) == len(set(drawn))
        assert set(drawn) == _machine_edges()
        assert sorted(noops) == [
            ("PAUSED", "PAUSED", "pause_requested (no-op)"),
            ("STOPPING", "STOPPING", "stop_requested (no-op)"),
        ]

    def test_states_md_lists_every_state_trigger_and_edge(self) -> None:
        """docs/states.md documents every state, every trigger and every table row."""
        text = diagram.render_states_md()
        for state in State:
            assert f"| `{state.name}` | {table.STATE_DOCS[state]} |" in text
        for trigger in table.triggers():
            assert f"| `{trigger}` | {table.TRIGGER_DOCS[trigger]} |" in text
        rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| (.+?) \| (.*?) \|$", text, flags=re.MULTILINE)
        assert len(rows) == len(table.edges())
        assert ("STOPPING", "stop_requested", "(no-op, stays)", "") in rows


class TestStaleness:
    """A table change without regenerating is caught, on files and through the CLI."""

    def test_missing_files_are_stale(self, tmp_path: Path) -> None:
        """In an empty root every generated file is stale; README is only considered when it exists."""
        assert set(diagram.stale_files(tmp_path)) == {tmp_path / p for p in COMMITTED}

    def test_write_files_makes_root_fresh(self, tmp_path: Path) -> None:
        """write_files() creates every file, fills the README block, and a second run changes nothing."""
        (tmp_path / "README.md").write_text(README_STUB, encoding="utf-8")
        written = diagram.write_files(tmp_path)
        assert set(written) == {tmp_path / p for p in COMMITTED} | {tmp_path / "README.md"}
        assert diagram.stale_files(tmp_path) == []
        assert diagram.write_files(tmp_path) == []
        readme = (tmp_path / "README.md").read_text(encoding="utf-8")
        assert readme.startswith("# plaita\n\nIntro.\n\n")
        assert readme.endswith("\n\nMore.\n")
        assert diagram.render_readme_block() in readme
        assert "\nold\n" not in readme

    def test_table_change_without_regenerating_is_stale(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Adding an edge to TRANSITIONS makes every generated file stale until write_files() runs."""
        _plant_tree(tmp_path)
        assert diagram.stale_files(tmp_path) == []
        assert diagram.TRIGGER_DOCS is table.TRIGGER_DOCS  # so the setitem below reaches the renderer
        monkeypatch.setattr(
            table,
            "TRANSITIONS",
            [*table.TRANSITIONS, {"trigger": "emergency_halt", "source": State.READING, "dest": State.STOPPED}],
        )
        monkeypatch.setitem(table.TRIGGER_DOCS, "emergency_halt", "an operator pulls the plug")
        assert ("READING", "STOPPED", "emergency_halt", None) in set(_mermaid_edges(diagram.render_mermaid()))
        expected_stale = {tmp_path / p for p in COMMITTED} | {tmp_path / "README.md"}
        assert set(diagram.stale_files(tmp_path)) == expected_stale
        assert set(diagram.write_files(tmp_path)) == expected_stale
        assert diagram.stale_files(tmp_path) == []

    @pytest.mark.parametrize("relpath", sorted(COMMITTED))
    def test_appended_line_is_stale(self, tmp_path: Path, relpath: str) -> None:
        """Appending a line to one generated file makes exactly that file stale."""
        _plant_tree(tmp_path)
        with (tmp_path / relpath).open("a", encoding="utf-8") as f:
            f.write("    hand-edited\n")
        assert diagram.stale_files(tmp_path) == [tmp_path / relpath]

    def test_readme_block_edit_is_stale_but_prose_is_not(self, tmp_path: Path) -> None:
        """Editing inside the README markers makes README stale; editing outside them does not."""
        _plant_tree(tmp_path)
        readme = tmp_path / "README.md"
        readme.write_text(readme.read_text(encoding="utf-8") + "A new paragraph.\n", encoding="utf-8")
        assert diagram.stale_files(tmp_path) == []
        readme.write_text(readme.read_text(encoding="utf-8").replace("    [*] --> INIT\n", ""), encoding="utf-8")
        assert diagram.stale_files(tmp_path) == [readme]


class TestCli:
    """``python -m plaita diagram [--check] --root DIR`` run as a real subprocess."""

    def test_check_fresh_exits_0_and_stale_exits_1(self, tmp_path: Path) -> None:
        """--check exits 0 on a fresh root, 1 naming the stale file on stderr, and a plain run repairs it."""
        _plant_tree(tmp_path, readme=False)
        fresh = _cli("--check", "--root", str(tmp_path))
        assert (fresh.returncode, fresh.stderr) == (0, "")

        mmd = tmp_path / "diagrams" / "worker.mmd"
        with mmd.open("a", encoding="utf-8") as f:
            f.write("    READING --> STOPPED: hand_edit\n")
        stale = _cli("--check", "--root", str(tmp_path))
        assert stale.returncode == 1
        assert str(mmd) in stale.stderr
        assert "worker.dot" not in stale.stderr and "states.md" not in stale.stderr
        assert "hand_edit" in mmd.read_text(encoding="utf-8")  # --check writes nothing

        repaired = _cli("--root", str(tmp_path))
        assert repaired.returncode == 0
        assert str(mmd) in repaired.stdout
        assert _cli("--check", "--root", str(tmp_path)).returncode == 0

    def test_check_on_repository_exits_0(self) -> None:
        """--check on the repository itself passes (what CI runs)."""
        proc = _cli("--check", "--root", str(ROOT))
        assert proc.returncode == 0, proc.stderr
