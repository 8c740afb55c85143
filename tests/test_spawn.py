"""The launcher's process starts: `python script.py` forked from the fork server runs as a fresh interpreter would
run it (argv, environment, search path, output, exit code, atexit), and a process whose environment differs in
what an interpreter reads as it starts is started fresh."""
import json
import os
import subprocess
import sys

import pytest

from easyscale_ext import spawn

SCRIPT = """\
import atexit, json, os, sys
seen = {"argv": sys.argv, "path0": sys.path[0], "torch_loaded": "torch" in sys.modules,
        "dynamo_loaded": "torch._dynamo" in sys.modules,
        "id": os.environ.get("EASYSCALE_WORKER_ID"), "other": os.environ.get("OTHER"), "cwd": os.getcwd(),
        "threads": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None}
atexit.register(lambda: print("atexit", flush=True))
print(json.dumps(seen), flush=True)
if sys.argv[1] == "sleep":
    import time
    time.sleep(60)
sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else 0)
"""

# Run in its own process: the fork server is one per launching process, started under the first child's environment.
DRIVER = """\
import json, os, sys, time
from easyscale_ext import spawn

if __name__ == "__main__":
    script, tmp = sys.argv[1], sys.argv[2]
    base = dict(os.environ, OMP_NUM_THREADS="1")
    rows = []
    for name, env, arg in [("first", dict(base, EASYSCALE_WORKER_ID="w0"), "3"),
                           ("second", dict(base, EASYSCALE_WORKER_ID="w1"), "0"),
                           ("other", dict(base, EASYSCALE_WORKER_ID="w2", OTHER="1"), "0"),
                           ("off", dict(base, EASYSCALE_WORKER_ID="w4", EASYSCALE_FORK_SERVER="0"), "0"),
                           ("killed", dict(base, EASYSCALE_WORKER_ID="w3"), "sleep")]:
        log = os.path.join(tmp, name + ".log")
        child = spawn.start([sys.executable, script, arg], env, ["EASYSCALE_WORKER_ID"], log_path=log)
        if arg == "sleep":
            while not os.path.getsize(log):  # it runs: its first line is out
                time.sleep(0.05)
            child.kill()
        code = child.wait()
        rows.append({"name": name, "kind": type(child).__name__, "code": code, "out": open(log).read()})
    print(json.dumps(rows))
"""


@pytest.mark.multiprocess  # starts a fork server and its children
def test_a_forked_process_runs_its_script_as_a_fresh_interpreter_would(tmp_path):
    script, driver = tmp_path / "job" / "script.py", tmp_path / "driver.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    driver.write_text(DRIVER)
    launcher_env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the jobs' say 1
    out = subprocess.run([sys.executable, str(driver), str(script), str(tmp_path)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=launcher_env)
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads(out.stdout.splitlines()[-1])}
    for name in ("first", "second", "killed"):
        assert rows[name]["kind"] == "Forked", rows[name]
        seen = json.loads(rows[name]["out"].splitlines()[0])
        assert seen["torch_loaded"]  # the fork server's: the script did not import it
        assert seen["dynamo_loaded"]  # so is what a torch.optim optimizer imports as it is first built
        assert seen["path0"] == str(script.parent) and seen["argv"][0] == str(script)
        assert seen["cwd"] == str(tmp_path) and seen["other"] is None
        assert seen["threads"] == 1  # OMP_NUM_THREADS=1 read as the server loaded torch: the job's, not the launcher's
    assert json.loads(rows["second"]["out"].splitlines()[0])["id"] == "w1"  # its own environment
    assert (rows["first"]["code"], rows["second"]["code"], rows["killed"]["code"]) == (3, 0, -9)
    assert rows["first"]["out"].splitlines()[1:] == ["atexit"]  # exit handlers run on sys.exit, as in Python
    # Another value of a variable an interpreter may read as it starts: a fresh interpreter, torch not loaded.
    assert rows["other"]["kind"] == "Popen" and rows["other"]["code"] == 0
    seen = json.loads(rows["other"]["out"].splitlines()[0])
    assert not seen["torch_loaded"] and not seen["dynamo_loaded"] and seen["other"] == "1"
    assert rows["other"]["out"].splitlines()[1:] == ["atexit"]
    assert rows["off"]["kind"] == "Popen" and rows["off"]["code"] == 0


def test_a_fork_server_setting_other_than_0_or_1_is_refused_naming_both():
    assert spawn.fork_server_on({}) and not spawn.fork_server_on({"EASYSCALE_FORK_SERVER": "0"})
    with pytest.raises(ValueError, match="set 1 .* or 0"):
        spawn.fork_server_on({"EASYSCALE_FORK_SERVER": "yes"})
