"""The `zfbench` console script: `zfbench COMMAND ...` runs `python -m zfbench.COMMAND ...`.

One entry point for an installed zfbench (`zfbench run`, `zfbench simulate --pcie gen4`,
`zfbench predict --paper`, ...); each command keeps its own flags and `--help`. An unknown
command is one `error:` line naming the commands, exit code 2.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "run": "measure the strategies on the real engine",
    "simulate": "simulate the strategies on a named node",
    "predict": "predict ZenFlow from a measured ZeRO-Offload step",
    "advise": "the best offloading setup for a model on a node, as a DeepSpeed config",
    "validate": "measured engine against the simulator",
    "figures": "rebuild the paper's figures",
    "gradients": "gradient statistics of a real model",
    "accuracy": "fine-tuning accuracy per strategy",
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    return "\n".join(["usage: zfbench COMMAND [flags]   (zfbench COMMAND --help for its flags)",
                      "", "commands:"] +
                     [f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; commands are: {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    return importlib.import_module(f"zfbench.{name}").main(rest)


if __name__ == "__main__":
    sys.exit(main())
