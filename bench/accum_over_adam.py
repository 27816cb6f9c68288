"""The engine's host accumulation's streaming rate over its host AdamW's, as the rate probe
measures both (`zfbench.sims.host_traffic.ACCUM_OVER_ADAM_STREAM`'s source; issue 44).

    python bench/accum_over_adam.py [--threads 1,2] [--elems 16777216,67108864]
        [--repeats 5] [--out bench/results/accum_over_adam]

For each thread count and size, `zfbench.real.rate_probe.RateProbe` (the buffers and
kernels a profile times: bf16 gradients landed into the fp32 window, host AdamW on fp32
master and moments into the bf16 wire) gives `host_accum_elems_per_s` and
`host_adam_params_per_s`; the ratio is the accumulation's bytes per second (10 B an
element) over AdamW's (28 B a parameter), the quantity `predict --from-run` multiplies the
fitted AdamW's streaming rate by. Writes DIR/accum_over_adam.csv (one row per thread
count and size) and .json (the rows, the machine, the load before and after).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.progress import progress  # noqa: E402
from zfbench.core.provenance import machine  # noqa: E402
from zfbench.core.trace import write_csv_atomic, write_json_atomic  # noqa: E402
from zfbench.real.rate_probe import RateProbe  # noqa: E402
from zfbench.sims.costs import ACCUM_BYTES_PER_ELEMENT, ADAM_BYTES_PER_PARAM  # noqa: E402


def ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--threads", type=ints, default=[1, 2])
    ap.add_argument("--elems", type=ints, default=[16 * 2**20, 64 * 2**20])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/accum_over_adam")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    rows = []
    cases = [(t, n) for t in args.threads for n in args.elems]
    for threads, elems in progress(cases, desc="probe"):
        rates = RateProbe(elems, torch.bfloat16, threads, torch.device("cpu")).measure(
            repeats=args.repeats)
        accum, adam = rates["host_accum_elems_per_s"], rates["host_adam_params_per_s"]
        rows.append({"threads": threads, "elems": elems,
                     "host_accum_elems_per_s": accum, "host_adam_params_per_s": adam,
                     "host_accum_first_elems_per_s": rates["host_accum_first_elems_per_s"],
                     "accum_over_adam_stream": accum * ACCUM_BYTES_PER_ELEMENT
                     / (adam * ADAM_BYTES_PER_PARAM)})
    args.out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    write_csv_atomic(frame, args.out / "accum_over_adam.csv")
    write_json_atomic(args.out / "accum_over_adam.json",
                      {"rows": rows, "machine": machine(), "torch": torch.__version__,
                       "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                       "accum_bytes_per_element": ACCUM_BYTES_PER_ELEMENT,
                       "adam_bytes_per_param": ADAM_BYTES_PER_PARAM})
    print(frame.to_string(index=False))
    print(f"wrote {args.out}/accum_over_adam.csv and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
