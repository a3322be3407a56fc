"""The driver's key file placed on another node of a real Ray cluster (key_placement.py): written
there 0600 by a task pinned to that node, at a path that did not exist, removed when the driver exits."""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

_DRIVER = textwrap.dedent("""
    import json, os, stat, sys, ray
    from lean_rl.utils.ray_utils import init_ray
    from lean_rl.backends.sglang import key_placement
    from lean_rl.backends.sglang.run_key import FileBackedKey
    init_ray(sys.argv[1])
    path, user_path, key = sys.argv[2], sys.argv[3], "k3y-of-this-run"
    here = ray.get_runtime_context().get_node_id()
    target = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here)
    placed = key_placement.place_key_file(FileBackedKey(key, path, private=True), [target, here])
    again = key_placement.place_key_file(FileBackedKey(key, path, private=True), [target])
    user = key_placement.place_key_file(FileBackedKey(key, user_path), [target])
    # which node ran the pinned task, as that task sees it (a second path: the first exists now)
    ran_on, written = ray.get(key_placement._write_key_task.options(
        num_cpus=0, scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
            node_id=target, soft=False)).remote(path + "2", key))
    # the nodes the call sites place on: a placement group's bundles (engines), rank addresses (trainer)
    from ray.util.placement_group import placement_group, remove_placement_group
    group = placement_group([{"CPU": 0.01}] * 2, strategy="STRICT_SPREAD")
    assert group.wait(timeout_seconds=60)
    bundle_nodes = key_placement.node_ids_of_bundles(group)
    bundle_ips = ray.get([ray.remote(num_cpus=0)(ray.util.get_node_ip_address).options(
        scheduling_strategy=ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=i)).remote() for i in range(2)])
    remove_placement_group(group)
    info = os.stat(path)
    print(json.dumps({"target": target, "placed": placed, "again": again, "user": user, "ran_on": ran_on,
                      "written": written, "mode": stat.S_IMODE(info.st_mode),
                      "dir_mode": stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode),
                      "content": open(path).read(), "bundle_nodes": bundle_nodes,
                      "nodes_at_bundle_ips": key_placement.node_ids_at(bundle_ips)}))
""")


def test_the_key_file_is_written_0600_on_the_pinned_node_and_removed_at_exit(simulated_cluster, tmp_path):
    path = tmp_path / "placed" / "api_key"
    result = subprocess.run([sys.executable, "-c", _DRIVER, simulated_cluster.address, str(path),
                             str(tmp_path / "user_key")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["placed"] == {seen["target"]: True}  # the driver's own node is not asked
    assert seen["again"] == {} and seen["user"] == {}  # placed once; the user's file is never copied
    assert seen["ran_on"] == seen["target"] and seen["written"] is True
    assert seen["mode"] == 0o600 and seen["dir_mode"] == 0o700 and seen["content"] == "k3y-of-this-run\n"
    assert len(set(seen["bundle_nodes"])) == 2 and set(seen["bundle_nodes"]) == set(seen["nodes_at_bundle_ips"])
    assert not path.exists()  # the driver's exit ran the pinned removal on that node
    # the direct task's second file was not placed by place_key_file: nothing removes it but us
    (tmp_path / "placed" / "api_key2").unlink()
