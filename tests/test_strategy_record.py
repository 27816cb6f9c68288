"""The one strategy record (zfbench.core.strategies): the engine's and the simulator's
registries cover exactly its strategies, and no other module compares a strategy name."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from zfbench.core import strategies
from zfbench.core.strategies import (ENGINE_STRATEGIES, OFFLOAD_STRATEGIES, SIM_STRATEGIES,
                                     SIMULATED_ONLY, STRATEGY, STRATEGY_LIST)

ROOT = Path(__file__).resolve().parents[1]
NAMES = frozenset(STRATEGY)


def test_record_is_consistent():
    assert [s.name for s in STRATEGY_LIST] == list(SIM_STRATEGIES)
    assert ENGINE_STRATEGIES == tuple(s.name for s in STRATEGY_LIST if s.engine)
    assert SIMULATED_ONLY == ("zero-infinity",)
    for s in STRATEGY_LIST:
        assert s.adamw in ("device", "host", "both")
        assert s.measure in ("fixed", "windows")
        assert s.offloads_optimizer == (s.adamw != "device")
        assert s.d2h == s.h2d == s.offloads_optimizer  # what moves: none or both ways
        assert not (s.delayed and s.has_windows)
        assert s.has_windows == (s.measure == "windows")
    assert set(OFFLOAD_STRATEGIES) == {s for s in ENGINE_STRATEGIES if strategies.offloads(s)}
    assert strategies.ZERO_OFFLOAD_STRATEGIES == ("zero-offload", "zero-offload-dpu")
    assert strategies.BASELINE in STRATEGY
    assert not strategies.has_windows("no-such-strategy")


def test_engine_registry_is_the_records():
    pytest.importorskip("torch")
    from zfbench.real.engine import STRATEGY_CLASSES
    assert tuple(STRATEGY_CLASSES) == ENGINE_STRATEGIES


def test_simulator_registry_is_the_records():
    from zfbench.sims.strategies import STEP_FUNCTIONS, ZERO3_STEP_FUNCTIONS
    assert set(STEP_FUNCTIONS) == set(SIM_STRATEGIES)
    # a ZeRO-3 step for exactly the strategies whose stage the zero_stage knob chooses
    assert set(ZERO3_STEP_FUNCTIONS) == set(strategies.ZERO_STAGE_STRATEGIES) == {"zenflow"}
    assert [strategies.zero_stage_of(s, 3) for s in SIM_STRATEGIES] == [2, 2, 2, 3, 3]
    assert [strategies.zero_stage_of(s, 2) for s in SIM_STRATEGIES] == [2, 2, 2, 3, 2]


# Where a strategy-name literal is compared on purpose: (file, text of the comparison, why).
ALLOWED = {
    ("zfbench/core/scenario.py", 'f.name != "zenflow"'): "the Scenario field zenflow",
    ("real/runner.py", '"zenflow" in zero'): "the config's zero_optimization.zenflow section",
}


def _names_in(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and node.value in NAMES:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for e in node.elts for n in _names_in(e)]
    return []


def compared_names(source: str) -> list[tuple[int, str]]:
    """(line, text) of each comparison in `source` with a strategy-name constant."""
    return [(node.lineno, ast.get_source_segment(source, node))
            for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Compare)
            and any(_names_in(op) for op in (node.left, *node.comparators))]


def name_comparisons() -> tuple[list[tuple[str, int, str]], set]:
    """Compare nodes (==, !=, in, ...) with a strategy-name constant among their operands,
    in every module of zfbench/, real/, sims/ and analysis/ but the record's own: those
    not in ALLOWED, and the ALLOWED entries met."""
    found, met = [], set()
    for top in ("zfbench", "real", "sims", "analysis"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "zfbench/core/strategies.py":
                continue
            for line, text in compared_names(path.read_text()):
                if (rel, text) in ALLOWED:
                    met.add((rel, text))
                else:
                    found.append((rel, line, text))
    return found, met


def test_the_scan_sees_each_kind_of_comparison():
    source = ('a = s == "zenflow"\nb = "device" != s\nc = s in ("zero-offload", "x")\n'
              'd = s == "cpu"\ne = strategies.has_windows(s)\n')
    assert [line for line, _ in compared_names(source)] == [1, 2, 3]


def test_no_strategy_name_comparisons_outside_the_record():
    found, met = name_comparisons()
    assert found == []
    assert met == set(ALLOWED)  # no stale allowance
