"""The strategy <-> engine protocol (zfbench.real.engine_protocol) holds: the engine and every
strategy satisfy it, and the strategy modules read nothing from the engine that the
protocol does not declare (read from the source, so the protocol cannot drift)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_helpers import BiasMLP, config, make_engine  # noqa: E402
from zfbench.real.engine_protocol import EngineForStrategy, StrategyForEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# the modules whose code runs as a strategy, each naming the engine `e`, `engine` or
# `self.e`
STRATEGY_MODULES = ("real/strategies.py", "real/zenflow.py", "real/zenflow_device.py",
                    "real/zenflow_shard.py")


def declared(protocol) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
    return names


def engine_reads(path: Path) -> set[str]:
    """Attributes read or written on the engine in one module's source."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("e", "engine"):
            found.add(node.attr)
        elif (isinstance(owner, ast.Attribute) and owner.attr == "e"
              and isinstance(owner.value, ast.Name) and owner.value.id == "self"):
            found.add(node.attr)
    return found


@pytest.mark.parametrize("module", STRATEGY_MODULES)
def test_strategies_read_only_what_the_protocol_declares(module):
    used = engine_reads(ROOT / module)
    assert used, f"{module}: no engine access found (has the engine's name changed?)"
    missing = sorted(used - declared(EngineForStrategy))
    assert not missing, f"{module} reads {missing} from the engine: declare them in " \
                        f"zfbench.real.engine_protocol.EngineForStrategy"


@pytest.mark.parametrize("strategy", ["device", "zero-offload", "zero-offload-dpu", "zenflow"])
def test_the_engine_and_each_strategy_satisfy_the_protocol(strategy):
    engine = make_engine(BiasMLP(), config(strategy))
    try:
        assert isinstance(engine, EngineForStrategy)
        assert isinstance(engine.strategy, StrategyForEngine)
        for name in declared(EngineForStrategy):
            assert hasattr(engine, name), name
    finally:
        engine.close()
