"""The real engine: ZenFlow and its baselines in PyTorch, behind DeepSpeed's API.

`import zfbench.real as deepspeed` gives a DeepSpeed script what it calls: `initialize`
(real/deepspeed_api.py; `initialize(model, config)` is zfbench's short form),
`add_config_arguments` and `init_distributed`.

The names load on first use (PEP 562), so importing a torch-free module of the package
(`zfbench.real.memory`, say) does not load torch and the engine.
"""

import importlib

_HOMES = {"InitializeError": "deepspeed_api", "add_config_arguments": "deepspeed_api",
          "init_distributed": "deepspeed_api", "initialize": "deepspeed_api",
          "Engine": "engine", "NonFiniteGradientError": "engine"}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'zfbench.real' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"zfbench.real.{_HOMES[name]}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
