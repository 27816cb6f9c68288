"""ZeRO-Offload from 1 to 128 GPUs on DGX-2 nodes, simulated, with each cost of scale
switched off in turn (issue 44 item 3).

    python bench/zo_scaling.py [--gpus 1,2,4,8,16,32,64,128] [--out DIR]

Case: the 10B GPT-2 shape of the ZeRO-Offload paper (50 layers, hidden 4096, 32 heads),
micro-batch 8 x 1024 tokens per GPU, fp16, activation checkpointing, no accumulation,
DeepSpeed 0.3 as that paper ran it (fused fp16 upload, overlap_comm, pinned buffers,
ZeRO-2 buckets reduced per owner), on `dgx2-v100` nodes of 16 GPUs joined by
`ib-edr-dgx2`. For each GPU count: the simulated step, TFLOPS per GPU (validate's
counting rule, zfbench.validate.metrics) and the step's parts, then the same with one
mechanism switched off:
- `cores_shared`: every rank gets the node's 48 cores (host_cores 48 x ranks per node);
- `numa_unbound`: each rank's threads bound to its own cores (bind_cores: local memory);
- `dram_shared`: host DRAM bandwidth x1000 (a hardware file overriding xeon-8168);
- `pcie_switch_shared`: one GPU per PCIe switch (gpus_per_switch 1);
- `inter_node_net`: the nodes joined at NVSwitch's rate (inter_net nvswitch-v100);
- `reduce_per_owner`: ZeRO-2's buckets reduce-scattered ideally (zero2_reduce).
`all_off` switches every one off at once. A mechanism's cost at a count (`cost_s`) is
the step with it minus the step without it. The bundled ZeRO-Offload rows of
ZeRO-Infinity's Figure 6c (backward time, 4-64 GPUs) are simulated with each variant
too: checks, not fits. Writes DIR/zo_scaling.csv (one row per GPU count and variant),
DIR/zo_scaling_fig6c.csv and DIR/zo_scaling.json (provenance). Simulated: the same on
any machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.progress import progress  # noqa: E402
from zfbench.core.provenance import provenance  # noqa: E402
from zfbench.core.trace import write_json_atomic  # noqa: E402
from zfbench.sims.costs import SimSettings  # noqa: E402
from zfbench.sims.settings import node_knobs  # noqa: E402
from zfbench.sims.simulator import simulate  # noqa: E402
from zfbench.validate.metrics import measure, step_parts  # noqa: E402
from zfbench.validate.rows import (bundled_path, read_rows, row_settings,  # noqa: E402
                                    skip_of)

MODEL = "gpt2:layers=50,hidden=4096,heads=32"
STRATEGY = "zero-offload"
HOST = "xeon-8168"
CORES = 48  # 2 x Xeon Platinum 8168, 24 cores each (hardware.json hosts xeon-8168)
VARIANTS = ("all_on", "cores_shared", "numa_unbound", "dram_shared", "pcie_switch_shared",
            "inter_node_net", "reduce_per_owner", "all_off")


def no_dram_limit_file(directory: Path) -> Path:
    """A hardware file whose xeon-8168 has 1000x the DRAM bandwidth of the preset."""
    data = json.loads((ROOT / "zfbench" / "data" / "hardware.json").read_text())
    host = json.loads(json.dumps(data["hosts"][HOST]))
    field = host["dram_theoretical_bytes_per_s_per_socket"]
    field["value"] *= 1000
    field["source"] = "bench/zo_scaling.py: the preset's x1000, DRAM sharing switched off"
    path = directory / "no_dram_limit.json"
    path.write_text(json.dumps({"hosts": {HOST: host}}))
    return path


def variant_knobs(variant: str, gpus: int, dram_file: Path) -> dict:
    """The knobs of one variant of the bench's case at `gpus` GPUs (module docstring)."""
    knobs = {**node_knobs("dgx2-v100", gpus), "model": MODEL, "micro_batch": 8,
             "seq": 1024, "precision": "fp16", "activation_checkpointing": True,
             "pin_memory": True, "overlap_comm": True, "fused_param_upload": True,
             "zero2_reduce": "reduce", "steps": 4}
    return switched_off(variant, knobs, dram_file)


def switched_off(variant: str, knobs: dict, dram_file: Path) -> dict:
    """`knobs` (flat, on DGX-2 nodes) with `variant`'s mechanism switched off."""
    knobs = dict(knobs)
    off = VARIANTS[1:-1] if variant == "all_off" else (variant,)
    if "cores_shared" in off:
        knobs["host_cores"] = CORES * knobs["gpus_per_node"] if knobs.get(
            "gpus_per_node") else CORES * knobs["gpus"]
    if "numa_unbound" in off:
        knobs["bind_cores"] = True
    if "dram_shared" in off:
        knobs["hardware"] = str(dram_file)
    if "pcie_switch_shared" in off:
        knobs["gpus_per_switch"] = 1
    if "inter_node_net" in off and knobs.get("nodes", 1) > 1:
        knobs["inter_net"] = "nvswitch-v100"
    if "reduce_per_owner" in off:
        knobs["zero2_reduce"] = "reduce-scatter"
    return knobs


def fig6c_rows(dram_file: Path) -> list[dict]:
    """The bundled ZeRO-Offload rows of ZeRO-Infinity's Figure 6c (backward time, 4-64
    GPUs on DGX-2 nodes) simulated with each variant: how each mechanism moves them."""
    out = []
    for row in read_rows(bundled_path())[1]:
        if not row["id"].startswith("zi-fig6c-") or row["strategy"] != STRATEGY:
            continue
        base = row_settings(row).as_dict()
        for variant in VARIANTS:
            s = SimSettings.from_knobs(**switched_off(variant, base, dram_file))
            got = measure(simulate(s, STRATEGY), "backward_time_s", skip_of(s, STRATEGY))
            published = float(row["value"])
            out.append({"row": row["id"], "gpus": s.machine.ranks, "variant": variant,
                        "published_s": published, "simulated_s": got,
                        "error_pct": 100 * (got - published) / published})
    return out


def one(variant: str, gpus: int, dram_file: Path) -> dict:
    settings = SimSettings.from_knobs(**variant_knobs(variant, gpus, dram_file))
    result = simulate(settings, STRATEGY)
    skip = skip_of(settings, STRATEGY)
    parts = step_parts(result, skip)
    return {"gpus": gpus, "nodes": settings.machine.nodes, "variant": variant,
            "step_s": parts["sim_step_time_s"],
            "tflops_per_gpu": measure(result, "tflops_per_gpu", skip),
            "compute_s": parts["sim_compute_s"], "exposed_io_s": parts["sim_exposed_io_s"],
            "host_wait_s": parts["sim_host_wait_s"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--gpus", default="1,2,4,8,16,32,64,128",
                   help="GPU counts, comma-separated (more than 16: whole DGX-2 nodes)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    try:
        counts = [int(g) for g in args.gpus.split(",")]
    except ValueError:
        p.error(f"--gpus {args.gpus!r}: give whole numbers, e.g. 1,16,128")
    if any(g < 1 or (g > 16 and g % 16) for g in counts):
        p.error(f"--gpus {args.gpus}: each count 1-16, or a multiple of 16 (whole nodes)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dram_file = no_dram_limit_file(Path(tmp))
        cases = [(v, g) for g in counts for v in VARIANTS]
        for variant, gpus in progress(cases, desc="simulating", unit="case"):
            rows.append(one(variant, gpus, dram_file))
        fig6c = fig6c_rows(dram_file)
    base = {r["gpus"]: r["step_s"] for r in rows if r["variant"] == "all_on"}
    for r in rows:
        r["cost_s"] = base[r["gpus"]] - r["step_s"]  # what the switched-off mechanism costs
    args.out.mkdir(parents=True, exist_ok=True)
    for name, table in (("zo_scaling.csv", rows), ("zo_scaling_fig6c.csv", fig6c)):
        with open(args.out / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows({k: (f"{v:.6g}" if isinstance(v, float) else v)
                              for k, v in r.items()} for r in table)
    write_json_atomic(args.out / "zo_scaling.json",
                      {"provenance": provenance(argv, "bench/zo_scaling.py"), "model": MODEL,
                       "strategy": STRATEGY, "variants": list(VARIANTS)})
    for g in counts:
        mine = {r["variant"]: r for r in rows if r["gpus"] == g}
        costs = "  ".join(f"{v} {mine[v]['cost_s']:+.3f}" for v in VARIANTS[1:])
        print(f"{g:>4} GPUs: step {mine['all_on']['step_s']:.3f} s, "
              f"{mine['all_on']['tflops_per_gpu']:.1f} TFLOPS/GPU; cost (s): {costs}")
    for variant in VARIANTS:
        errors = [r["error_pct"] for r in fig6c if r["variant"] == variant]
        print(f"Figure 6c ZeRO-Offload backward, {variant}: errors "
              + " ".join(f"{e:+.1f}%" for e in errors)
              + f" (mean |error| {sum(map(abs, errors)) / len(errors):.1f}%)")
    print(f"wrote {args.out}/zo_scaling.csv, zo_scaling_fig6c.csv and zo_scaling.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
