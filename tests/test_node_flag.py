"""`--node NAME` on simulate and predict, and `--sweep node=...`: a node preset's knobs
under the flags given, checked against the same run spelled out knob by knob."""

import json

import pandas as pd
import pytest

from zfbench.core import hardware
from zfbench.predict.command import main as predict_main
from zfbench.simulate.command import main as simulate_main
from zfbench.sims.settings import SimSettingsError, node_knobs, on_node

SMALL = ["--model", "tiny", "--steps", "12", "--quiet", "--precision", "fp16"]


def test_on_node_takes_the_presets_knobs_under_the_given_ones():
    node = hardware.get_node("dgx2-v100")
    knobs = on_node("dgx2-v100", {"gpus": 64, "gpu": "a100-40g", "model": "tiny"})
    assert (knobs["nodes"], knobs["gpus_per_node"], knobs["gpus"]) == (4, 16, 64)
    assert knobs["inter_net"] == node.inter_net.name and knobs["host"] == node.host.name
    assert knobs["gpu"] == "a100-40g" and knobs["model"] == "tiny"  # the flag wins
    assert on_node("dgx2-v100", {"nodes": 2}) == node_knobs("dgx2-v100", 32)
    assert on_node("dgx2-v100", {}) == node_knobs("dgx2-v100")  # one whole node
    assert on_node("dgx2-v100", {"gpus": 4})["gpus"] == 4  # four of one node's GPUs


@pytest.mark.parametrize("given,words", [
    ({"gpus_per_node": 8}, "contradicts node dgx2-v100 (16 GPUs a node)"),
    ({"nodes": 2, "gpus": 16}, "--gpus 16 contradicts --nodes 2"),
    ({"gpus": 24}, "multiple of 16"),
    ({"profile": "prof.json"}, "a profile simulates the machine it was measured on"),
])
def test_on_node_refuses_contradictions(given, words):
    with pytest.raises(SimSettingsError, match=words.replace("(", r"\(").replace(")", r"\)")):
        on_node("dgx2-v100", given)


def test_simulate_on_a_node_equals_the_knobs_spelled_out(tmp_path, capsys):
    by_node, spelled = tmp_path / "node", tmp_path / "spelled"
    assert simulate_main(SMALL + ["--node", "dgx2-v100", "--gpus", "32",
                                  "--out", str(by_node)]) == 0
    first = capsys.readouterr().out.splitlines()[0]  # the settings line names the node
    assert "2 nodes x 16 x v100-sxm3-32g" in first and "(node dgx2-v100)" in first
    k = node_knobs("dgx2-v100", 32)
    flags = ["--gpu", k["gpu"], "--pcie", k["pcie"], "--host", k["host"], "--net", k["net"],
             "--gpus-per-switch", str(k["gpus_per_switch"]), "--nvme", k["nvme"],
             "--nvme-drives", str(k["nvme_drives"]), "--nodes", str(k["nodes"]),
             "--gpus-per-node", str(k["gpus_per_node"]), "--inter-net", k["inter_net"]]
    assert simulate_main(SMALL + flags + ["--out", str(spelled)]) == 0
    a, b = (pd.read_csv(d / "summary.csv") for d in (by_node, spelled))
    pd.testing.assert_frame_equal(a, b)
    assert set(a["ranks"]) == {32}
    settings = json.loads((by_node / "summary.json").read_text())["settings"]
    assert settings["node"] == "dgx2-v100" and settings["inter_net"] == k["inter_net"]
    assert (settings["nodes"], settings["gpu"]) == (2, "v100-sxm3-32g")


def test_sweep_over_nodes_one_row_each(tmp_path):
    out = tmp_path / "sweep"
    assert simulate_main(SMALL + ["--strategy", "zero-offload", "--sweep",
                                  "node=a100-4x-gen4,h100-8x-gen5", "--out", str(out)]) == 0
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["node"]) == ["a100-4x-gen4", "h100-8x-gen5"]
    assert list(summary["ranks"]) == [hardware.get_node(n).gpus for n in summary["node"]]
    head = json.loads((out / "summary.json").read_text())
    assert head["sweep"] == {"node": ["a100-4x-gen4", "h100-8x-gen5"]}
    assert "gpu" not in head["settings"] and "node" not in head["settings"]  # they differ
    # each row is the node's own simulation
    for node, row in zip(summary["node"], summary.itertuples()):
        one = tmp_path / node
        assert simulate_main(SMALL + ["--strategy", "zero-offload", "--node", node,
                                      "--out", str(one)]) == 0
        assert pd.read_csv(one / "summary.csv")["step_time_s"][0] == row.step_time_s


@pytest.mark.parametrize("argv,words", [
    (["--node", "dgx3"], "unknown node 'dgx3'; choose one of: a100-4x-gen4"),
    (["--node", "dgx2-v100", "--sweep", "node=a100-4x-gen4"], "not both"),
    (["--sweep", "node=a100-4x-gen4,nope"], "unknown node 'nope'"),
    (["--node", "dgx2-v100", "--gpus", "20"], "multiple of 16"),
])
def test_simulate_bad_node_input(tmp_path, capsys, argv, words):
    out = tmp_path / "out"
    assert simulate_main(SMALL + argv + ["--out", str(out)]) == 2
    assert words in capsys.readouterr().err
    assert not out.exists()


def test_predict_on_a_node(capsys):
    assert predict_main(["--from-breakdown", "compute=0.5,io=0.3,stall=2", "--node",
                         "a100-4x-gen4", "--model", "qwen2.5-1.5b", "--steps", "12",
                         "--quiet"]) == 0
    assert "zenflow" in capsys.readouterr().out
    assert predict_main(["--paper", "--node", "dgx2-v100", "--quiet"]) == 2
    assert "--paper simulates each bar on the node of the paper's figure" in \
        capsys.readouterr().err


def test_a_node_of_ones_own_hardware_file(tmp_path):
    # a lab box of two A100-40GB behind one PCIe switch, with its own GPU entry
    gpu = hardware.entry_of("gpus", hardware.get_gpu("a100-40g"))
    path = tmp_path / "lab.json"
    path.write_text(json.dumps({
        "gpus": {"lab-a100": gpu},
        "nodes": {"lab-2x": {"gpu": "lab-a100", "link": "gen4", "host": "epyc-7763-milan",
                             "net": "nvlink3", "gpus": {"value": 2, "source": "test"},
                             "gpus_per_switch": {"value": 2, "source": "test"}}}}))
    knobs = on_node("lab-2x", {"hardware": str(path)})
    assert (knobs["gpu"], knobs["gpus"], knobs["hardware"]) == ("lab-a100", 2, str(path))
    out = tmp_path / "out"
    assert simulate_main(SMALL + ["--hardware", str(path), "--node", "lab-2x",
                                  "--precision", "bf16", "--strategy", "zenflow",
                                  "--out", str(out)]) == 0
    head = json.loads((out / "summary.json").read_text())
    assert head["settings"]["node"] == "lab-2x" and head["settings"]["gpu"] == "lab-a100"
    assert list(pd.read_csv(out / "summary.csv")["ranks"]) == [2]
    # without the file the name is unknown, and the error lists what there is
    with pytest.raises(hardware.UnknownHardwareError, match="unknown node 'lab-2x'"):
        on_node("lab-2x", {})
