"""The default scenario's fixed settings, shared by the run, its probes and the benches.

The model and depth are `zfbench.real.runner.RunSpec`'s defaults (tinyllama-1.1b, 1 layer);
the precision is measured on the emulated accelerator (`zfbench.run_probe`) and bf16 on
CUDA (DEFAULT_PRECISION).
"""
DEFAULT_SEQ = 4
DEFAULT_PRECISION = "bf16"
