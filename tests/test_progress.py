"""Progress (zfbench/core/progress.py): a live bar on a terminal, two plain lines a phase
in a pipe or a CI log (issue 25: bars came out as carriage-return spam), nothing quiet."""

import io
import subprocess
import sys

from zfbench.core.progress import PhaseLines, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_phase_is_two_lines_without_carriage_returns():
    out = io.StringIO()
    items = list(progress(range(5), desc="  simulating", unit="run", file=out))
    bar = progress(total=3, desc="drawing", unit="fig", file=out)
    for _ in range(3):
        bar.set_postfix(loss="1.234", stall="5%")
        bar.update()
    bar.close()
    bar.close()  # once only
    assert items == [0, 1, 2, 3, 4]
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 4, lines
    assert lines[0] == "simulating: 5 run ..." and lines[1].startswith("simulating: 5/5 run in ")
    assert lines[3].startswith("drawing: 3/3 fig in ") and \
        lines[3].endswith("(loss=1.234, stall=5%)")


def test_on_a_terminal_a_live_bar_and_quiet_is_silent():
    tty = Terminal()
    for _ in progress(range(3), desc="steps", unit="step", file=tty):
        pass
    assert "\r" in tty.getvalue() and "3/3" in tty.getvalue()
    quiet = Terminal()
    bar = progress(total=2, desc="x", quiet=True, file=quiet)
    bar.update(2)
    bar.close()
    assert quiet.getvalue() == "" and not isinstance(bar, PhaseLines)


def test_a_piped_command_logs_lines_not_a_bar(tmp_path):
    done = subprocess.run([sys.executable, "-m", "zfbench.simulate", "--model", "tiny",
                           "--steps", "6", "--out", str(tmp_path / "sim")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\r" not in done.stdout + done.stderr
    assert "simulating: " in done.stderr and " run in " in done.stderr
