"""The KubeRay manifest the README points to: Ray's version is the pinned one, the head offers no slot, every
worker group offers slots, and every pod mounts the shared volume scripts and checkpoints live on."""
import json
import os
import re

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_manifest_matches_the_pinned_ray_and_offers_slots_on_workers_only():
    with open(os.path.join(ROOT, "examples", "kuberay-raycluster.yaml")) as f:
        manifest = yaml.safe_load(f)
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        pinned = re.search(r"^ray(?:\[[^\]]*\])?==(\S+)$", f.read(), re.M).group(1)
    spec = manifest["spec"]
    assert manifest["kind"] == "RayCluster" and spec["rayVersion"] == pinned
    slots = lambda group: json.loads(json.loads(group["rayStartParams"]["resources"]))["easyscale_slot"]  # noqa
    assert slots(spec["headGroupSpec"]) == 0
    assert all(slots(g) > 0 for g in spec["workerGroupSpecs"])
    for pod in [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]:
        container = pod["spec"]["containers"][0]
        assert pinned in container["image"]
        assert {"name": "shared", "mountPath": "/shared"} in container["volumeMounts"]
