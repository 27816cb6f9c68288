"""advise's files: `advice.csv` and `advice.json` (the whole ranked table), `ds_config.json`
(the top pick's DeepSpeed config) and `front.png` / `front.pdf` (step time against the
quality penalty, the front of the setups no other beats on both, the pick marked), all
written into a staging directory and renamed into place (zfbench.report's `staging_dir`).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from zfbench.advise.ranking import COLUMNS
from zfbench.report import land, staging_dir


def _cell(value):
    if isinstance(value, float):
        return "" if math.isnan(value) else format(value, ".6g")
    return "" if value is None else value


def _json_value(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row[k]) for k in COLUMNS})


def front(rows: list[dict]) -> list[dict]:
    """The rows no other row beats on both step time and quality penalty, by penalty."""
    known = sorted((r for r in rows if not math.isnan(r["quality_penalty_nats"])),
                   key=lambda r: (r["quality_penalty_nats"], r["step_s"]))
    out, best = [], math.inf
    for r in known:
        if r["step_s"] < best:
            out.append(r)
            best = r["step_s"]
    return out


def draw_front(rows: list[dict], pick: dict, default: dict | None, title: str, out: Path
               ) -> list[Path]:
    """front.png / front.pdf: every ranked setup, the front, the pick with its error bar."""
    from zfbench.analysis.plots import STRATEGY_STYLE, new_figure, save_figure

    fig, axes = new_figure(figsize=(6.4, 4.2))
    ax = axes[0][0]
    for name, style in STRATEGY_STYLE.items():
        mine = [r for r in rows if r["strategy"] == name
                and not math.isnan(r["quality_penalty_nats"])]
        if mine:
            ax.scatter([r["quality_penalty_nats"] for r in mine], [r["step_s"] for r in mine],
                       s=12, alpha=0.5, color=style["color"], marker=style["marker"],
                       label=style["label"])
    edge = front(rows)
    if edge:
        ax.step([r["quality_penalty_nats"] for r in edge], [r["step_s"] for r in edge],
                where="post", color="#555555", linewidth=1, label="front")
    err = 0 if math.isnan(pick["error_pct"]) else pick["error_pct"] / 100
    ax.errorbar([pick["quality_penalty_nats"]], [pick["step_s"]],
                yerr=[[pick["step_s"] * err], [pick["step_s"] * err]], fmt="*", ms=14,
                color="#EE3377", capsize=4, label=f"pick (#{pick['rank']})")
    if default is not None:
        ax.scatter([default["quality_penalty_nats"]], [default["step_s"]], s=80,
                   facecolors="none", edgecolors="#000000", label="default ZenFlow")
    ax.set_xlabel("quality penalty vs device AdamW (validation loss, nats; topic task)")
    ax.set_yscale("log")
    ax.set_ylabel("simulated step time (s, log scale)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return save_figure(fig, out, "front")


def write_all(out: Path, rows: list[dict], head: dict, config: dict, title: str) -> list[str]:
    """Every file into `out` (through a staging directory); their names."""
    default = next((r for r in rows if r["default_zenflow"]), None)
    with staging_dir(out) as stage:
        write_csv(stage / "advice.csv", rows)
        body = {**head, "columns": list(COLUMNS),
                "rows": [{k: _json_value(r[k]) for k in COLUMNS} for r in rows]}
        (stage / "advice.json").write_text(json.dumps(body, indent=1, default=str))
        (stage / "ds_config.json").write_text(json.dumps(config, indent=2) + "\n")
        figures = draw_front(rows, rows[0], default, title, stage)
        names = ["advice.csv", "advice.json", "ds_config.json", *(p.name for p in figures)]
        land(stage, out)
    return names
