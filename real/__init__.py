"""The real engine: ZenFlow and its baselines in PyTorch, behind DeepSpeed's API.

`import zfbench.real as deepspeed` gives a DeepSpeed script what it calls: `initialize`
(real/deepspeed_api.py; `initialize(model, config)` is zfbench's short form),
`add_config_arguments` and `init_distributed`.
"""

from zfbench.real.deepspeed_api import (InitializeError, add_config_arguments,
                                        init_distributed, initialize)
from zfbench.real.engine import Engine, NonFiniteGradientError

__all__ = ["Engine", "InitializeError", "NonFiniteGradientError", "add_config_arguments",
           "init_distributed", "initialize"]
