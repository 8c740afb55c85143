"""`easyscale simulate`'s command line: one-line errors before anything runs, the policies it runs, the cluster and
stand-ins it says it used, and the files it writes."""
import argparse
import json
import subprocess
import sys

import pytest

from easyscale_ext.cli import simulate as simulate_cli
from easyscale_ext.cli.errors import UsageError
from easyscale_ext.sched.policies import POLICIES, SIA_ARTIFACT, OptimusPolicy, made

WORKLOAD = "pollux/workloads/workload-6.csv"  # inside the data folder
PHILLY = "pollux/traces/philly.csv"


def easyscale(tmp_path, *argv):
    """Run `python -m easyscale_ext.cli simulate ARGV --out tmp_path/out` in a fresh interpreter (the timeout
    guards against a hang, not a slow machine: 5 s failed on two cores shared with other work)."""
    return subprocess.run([sys.executable, "-m", "easyscale_ext.cli", "simulate", *argv, "--no-progress",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)


@pytest.fixture
def unknown_apps(tmp_path):
    path = tmp_path / "apps.csv"
    path.write_text("name,time,application,num_replicas,batch_size\na,0,gpt9,1,8\nb,0,electra,1,8\nc,0,t5,1,8\n")
    return path


@pytest.mark.parametrize("argv, says", [
    (["--workload", "missing.csv"], "no workload file missing.csv: pass --workload"),
    (["--workload", "{lacking}"], "lacks the column(s) batch_size of a Pollux workload"),
    (["--workload", WORKLOAD, "--cluster", "abc"], "bad cluster group 'abc'"),
    (["--workload", WORKLOAD, "--cluster", "4x"], "bad cluster group '4x'"),
    (["--workload", WORKLOAD, "--cluster", "0x4"], "both at least 1"),
    (["--workload", WORKLOAD, "--cluster", "4x4:h100"], "no step-time profile for GPU type h100; use one of"),
    (["--workload", WORKLOAD, "--policy", "pollux,nope"], "(unknown: nope)"),
    (["--workload", WORKLOAD, "--policy", "optimus", "--cluster", "2x4:t4,1x4:v100"], "optimus models one GPU type"),
    (["--workload", "{unknown}"], "no profile for application(s) gpt9, t5 (profiled: bert"),
    (["--workload", "{unknown}", "--map", "gpt9=nothing"], "--map gpt9=nothing: expected APP=PROFILED"),
    (["--workload", WORKLOAD, "--data", "/nonexistent"], "no scheduling traces at /nonexistent"),
    (["--workload", WORKLOAD, "--calibration", "easyscale"], "EasyScale's job model runs EasyScale-format workloads"),
    (["--workload", PHILLY, "--policy", "sia"], "or draw their applications (workload.with_applications; "
                                                "easyscale simulate --applications SEED)"),
    (["--workload", WORKLOAD, "--applications", "0"], "names its jobs' applications already"),
    (["--workload", "easyscale/workloads/test.csv", "--calibration", "easyscale", "--policy", "pollux"],
     "pollux tunes batch sizes, which EasyScale's job model fixes"),
])
def test_a_mistake_is_one_line_exit_2_and_writes_nothing(tmp_path, unknown_apps, argv, says):
    lacking = tmp_path / "lacking.csv"
    lacking.write_text("name,time,application,num_replicas\na,0,bert,1\n")
    argv = [a.format(lacking=lacking, unknown=unknown_apps) for a in argv]
    proc = easyscale(tmp_path, *argv)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("easyscale simulate: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr
    assert not (tmp_path / "out").exists()


def test_unknown_applications_are_named_with_how_to_map_them(tmp_path, unknown_apps):
    proc = easyscale(tmp_path, "--workload", str(unknown_apps))
    assert "gpt9, t5" in proc.stderr and "electra" not in proc.stderr and "--map APP=PROFILED" in proc.stderr
    proc = easyscale(tmp_path, "--workload", str(unknown_apps), "--policy", "fifo", "--map", "gpt9=cifar10",
                     "--map", "t5=bert,electra=ncf")
    assert proc.returncode == 0, proc.stderr
    assert "run as: gpt9 -> cifar10, electra -> ncf, t5 -> bert" in proc.stdout
    assert json.loads((tmp_path / "out" / "apps-fifo.json").read_text())["stand_ins"]["electra"] == "ncf"


def test_policy_lists():
    assert simulate_cli.policy_names("all") == ["all"]
    assert simulate_cli.policy_names("tiresias, fifo,tiresias") == ["tiresias", "fifo"]
    for bad in ("", "all,fifo", "fifo,nope"):
        with pytest.raises(UsageError, match="expected all, or comma-separated names"):
            simulate_cli.policy_names(bad)
    with pytest.warns(FutureWarning, match="--policy sia-mixed is now called elastic-goodput-pairs-only"):
        assert simulate_cli.policy_names("sia-mixed,fifo") == ["elastic-goodput-pairs-only", "fifo"]


def parse(*argv):
    parser = argparse.ArgumentParser()
    simulate_cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["simulate", *argv, "--no-progress"])


def test_an_easyscale_workload_runs_on_easyscales_cluster_and_says_so(tmp_path, capsys):
    assert simulate_cli.main(parse("--workload", "easyscale/workloads/test.csv", "--policy", "yarn-cs")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("cluster 4x8:v100,2x8:p100,4x4:t4: 32 v100 + 16 p100 + 16 t4 (EasyScale's, the default for "
                      "its workloads); p100 steps are t4's scaled by EasyScale's measured p100/t4 ratios")
    assert out[1].startswith("applications without a profile run as: electra -> bert, swintransformer -> imagenet")
    assert out[2].startswith("repeated job names numbered: electra-28-1#2")
    assert simulate_cli.main(parse("--workload", WORKLOAD, "--policy", "fifo", "--limit", "5")) == 0
    assert capsys.readouterr().out.startswith("cluster 16x4:t4: 64 t4\n")


def test_easyscales_calibration_keeps_its_settings_and_a_repeated_names_last_row(tmp_path, capsys):
    assert simulate_cli.main(parse("--workload", "easyscale/workloads/test.csv", "--policy", "yarn-cs",
                                   "--calibration", "easyscale", "--out", str(tmp_path))) == 0
    assert "repeated job names, the last row of each kept (as EasyScale's simulator does): electra-28-1, " \
           "electra-28-2, electra-28-3" in capsys.readouterr().out
    record = json.loads((tmp_path / "test-yarn-cs.json").read_text())
    assert len(record["jobs"]) == 62
    assert {k: record["config"][k] for k in ("job_model", "start_s", "restart_s", "round_s")} == \
        {"job_model": "easyscale", "start_s": 20.0, "restart_s": 0.0, "round_s": 60.0}


@pytest.mark.slow
def test_the_philly_trace_runs_under_a_profiled_policy_with_drawn_applications(capsys):
    """The README's command, as written."""
    argv = ("--workload pollux/traces/philly.csv --limit 12 --applications 0 --policy tiresias,sia "
            "--cluster 2x4:t4,1x8:a100").split()
    assert simulate_cli.main(parse(*argv)) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[-2:]}
    assert rows.keys() == {"tiresias", "sia"}
    assert all(0 < float(cells[0]) < float("inf") for cells in rows.values())  # every job finished: a finite JCT


def test_runs_of_other_policies_write_their_own_files(tmp_path):
    written = []
    for policies in ("fifo", "tiresias", "fifo,tiresias"):
        before = set(tmp_path.iterdir())
        simulate_cli.main(parse("--workload", WORKLOAD, "--policy", policies, "--limit", "6", "--cluster", "4x4",
                                "--out", str(tmp_path)))
        written.append({p.name for p in set(tmp_path.iterdir()) - before})
    assert written[0] == {f"workload-6-fifo{end}" for end in (".json", "-gantt.png", "-jct-cdf.png", "-gpus.png",
                                                               "-summary.png")}
    assert written[1] == {name.replace("fifo", "tiresias") for name in written[0]}
    assert written[2] == {f"workload-6-fifo+tiresias-{figure}.png" for figure in ("jct-cdf", "gpus", "summary")}


def test_every_registered_policy_has_a_colour_of_its_own():
    from easyscale_ext.sched.plots import COLOURS

    assert len(POLICIES) > 10 and len({COLOURS[name] for name in POLICIES}) == len(POLICIES)


def test_the_job_model_switches_reach_every_policy(tmp_path):
    """--in-place, --freezing, the links and Sia's restart seconds are the run's, whatever the policy."""
    assert simulate_cli.main(parse("--workload", WORKLOAD, "--policy", "sia", "--limit", "4", "--cluster", "4x4",
                                   "--in-place", "on", "--freezing", "on", "--inter-node-gbps", "1.5",
                                   "--calibration", "sia-restarts", "--out", str(tmp_path))) == 0
    config = json.loads((tmp_path / "workload-6-sia.json").read_text())["config"]
    assert (config["in_place"], config["freezing"], config["inter_node_gbps"]) == ("on", "on", 1.5)
    assert config["restart_by_app"]["imagenet"] == 250 and config["slowdown"] == {}
    with pytest.raises(SystemExit):
        parse("--workload", WORKLOAD, "--in-place", "sometimes")


def test_a_policy_is_checked_as_its_calibration_makes_it(monkeypatch):
    """The policy checked against the workload and the cluster before anything runs is the one that runs: under
    Sia's calibration, the artifact's Pollux (here one that models one GPU type), not the project's."""
    monkeypatch.setitem(SIA_ARTIFACT, "pollux", lambda seed: OptimusPolicy())
    with pytest.raises(UsageError, match="optimus models one GPU type"):
        simulate_cli.main(parse("--workload", WORKLOAD, "--policy", "pollux", "--limit", "4", "--cluster",
                                "4x4:t4,4x4:v100", "--calibration", "sia"))


def test_a_pollux_format_workload_on_several_types_runs_in_sias_setting_by_default(tmp_path, capsys):
    """Only Sia's artifact simulates Pollux-format jobs on several GPU types: its job model and its runs of Pollux and
    Sia are the default there (stated), and --calibration none gives the project's; on one type nothing changes."""
    sia = "sia/workloads/philly/workload-1.csv"
    assert simulate_cli.main(parse("--workload", sia, "--policy", "sia", "--limit", "4", "--cluster", "sia",
                                   "--out", str(tmp_path / "auto"))) == 0
    assert "job model and settings: Sia's artifact's (--calibration sia)" in capsys.readouterr().out
    config = json.loads((tmp_path / "auto" / "workload-1-sia.json").read_text())["config"]
    assert config["slowdown"]["cifar10"] == 1.8 and config["per_type_batch"]
    assert simulate_cli.main(parse("--workload", sia, "--policy", "sia", "--limit", "4", "--cluster", "sia",
                                   "--calibration", "none", "--out", str(tmp_path / "none"))) == 0
    assert "Sia's artifact's" not in capsys.readouterr().out
    assert json.loads((tmp_path / "none" / "workload-1-sia.json").read_text())["config"]["slowdown"] == {}
    assert simulate_cli.main(parse("--workload", sia, "--policy", "fifo", "--limit", "4", "--cluster", "4x4",
                                   "--out", str(tmp_path / "one"))) == 0
    assert json.loads((tmp_path / "one" / "workload-1-fifo.json").read_text())["config"]["slowdown"] == {}
    assert made("pollux", "sia")(0).p == 0.5 and made("pollux", "none")(0).p == -1.0
    assert made("sia", "sia")(0).restart_by_app["imagenet"] == 250
    assert made("sia", "sia-restarts")(0).restart_by_app == {}
