"""Where a GPU run puts its processes, checked on the simulated cluster whose nodes declare 4 GPUs each
to Ray (there are none: nothing touches a device). The driver places the trainer ranks, PPO's critic,
the engines and the teacher's engines with the run's own code (rank_placement.place_ranks, engine_placement,
EngineActor.launch_plan), with a probe class in place of MegatronRank, and reports what each process was
given: its node, Ray's GPU ids, CUDA_VISIBLE_DEVICES, and each server's --tp-size / --base-gpu-id and
memory-release switches (review C4 and the placement rows of issue 22)."""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

_DRIVER = textwrap.dedent("""
    import argparse, json, os, sys
    import ray
    from lean_rl.backends.megatron.config import ParallelConfig
    from lean_rl.backends.megatron.rank_placement import COLOCATED_RANK_SHARE, place_ranks
    from lean_rl.backends.megatron.rank_actors import RankActors
    from lean_rl.backends.megatron.trainer_layout import TrainerLayout
    from lean_rl.backends.sglang.command_line import flags_to_dict, split_passthrough
    from lean_rl.backends.sglang.config import EngineConfig
    from lean_rl.backends.sglang.ports_and_key import resolve_api_key
    from lean_rl.backends.sglang.engine_actor import EngineActor
    from lean_rl.backends.sglang.engine_placement import EngineScheduler, colocated_placement
    from lean_rl.options import add_options, read_options
    from lean_rl.rollout.distillation_config import teacher_engine_config
    from lean_rl.utils.ray_utils import init_ray

    class WhereAmI:  # stands in for MegatronRank: only says where it runs
        def __init__(self, rank, *_):
            self.rank = rank
        def call(self, fn, *args):  # by reference, as MegatronRank.call
            return fn(self, *args)
        def location(self):
            return {"node_ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
                    "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                    "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def engine_config(*argv, colocated):
        parser = add_options(argparse.ArgumentParser(allow_abbrev=False), EngineConfig)
        args, unknown = parser.parse_known_args(["--hf-checkpoint", "/m", "--sglang-api-key", "k", *argv])
        # resolve_api_key: the key then travels to the actors as its file's path (run_key.py)
        return resolve_api_key(read_options(EngineConfig, args, device="cuda",
                                            server_passthrough=split_passthrough(unknown).server,
                                            on_cluster=True, colocated=colocated, dtype="bfloat16"), environ={})

    def ranks_of(layout, **placement):
        ranks = RankActors()
        place_ranks(ranks, WhereAmI, lambda rank: (rank,), layout, env={}, num_cpus_per_actor=0.25,
                    timeout_s=60, **placement)
        return ranks, ranks.call_all(WhereAmI.location, timeout_s=60)

    def servers(config, scheduler):  # the scheduler's placement group reserved already
        out = []
        for i in range(config.num_engines):
            options, visible = scheduler.actor_options(i)
            actor = ray.remote(EngineActor).options(**options).remote(config, i, "/tmp/unused.log",
                                                                      visible_devices=visible)
            plan = ray.get(actor.launch_plan.remote(), timeout=60)
            flags = flags_to_dict(plan["cmd"][3:])
            out.append({"node_ip": ray.get(actor.node_ip.remote(), timeout=60), "visible": plan["env"].get("CUDA_VISIBLE_DEVICES"),
                        "tp": flags["--tp-size"], "base_gpu": flags["--base-gpu-id"],
                        "memory_saver": "--enable-memory-saver" in flags,
                        "saver_env": plan["env"].get("SGLANG_MEMORY_SAVER_CUDA_GRAPH"),
                        "ifname": [plan["env"].get(v) for v in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")]})
            ray.kill(actor)
        scheduler.release()
        return out

    init_ray(sys.argv[1])
    out = {}
    # 1. colocated PPO over 2 trainer nodes x 4 GPUs: actor, critic, 4 engines of TP 2
    layout = TrainerLayout.derive(ParallelConfig(tensor_model_parallel_size=2), 8, "cuda", num_nodes=2, on_cluster=True)
    actor, out["actor"] = ranks_of(layout, colocated=True, colocate_with=None)
    critic, out["critic"] = ranks_of(layout, colocated=False, colocate_with=actor)
    engines = engine_config("--rollout-num-gpus", "8", "--rollout-num-gpus-per-engine", "2", colocated=True)
    nodes = layout.colocated_engine_nodes(engines.num_engines, engines.gpus_per_engine)
    placement = colocated_placement(actor.placement_group, nodes, device="cuda", ranks_per_node=layout.ranks_per_node,
                                    rank_gpu_ids=actor.gpu_ids, rank_share=COLOCATED_RANK_SHARE, cpus_per_rank=0.25,
                                    gpus_per_engine=engines.gpus_per_engine)
    scheduler = EngineScheduler(engines, placement)
    scheduler.reserve()  # nothing of its own: the trainer's bundles
    out["colocated_engines"] = servers(engines, scheduler)
    critic.shutdown()
    actor.shutdown()
    # 2. disaggregated on the same cluster: 1 trainer node of 4 GPUs, 2 engines of TP 2, a teacher of TP 2
    layout = TrainerLayout.derive(ParallelConfig(), 4, "cuda", num_nodes=1, on_cluster=True)
    trainer, out["trainer"] = ranks_of(layout, colocated=False, colocate_with=None)
    engines = engine_config("--rollout-num-gpus", "4", "--rollout-num-gpus-per-engine", "2", colocated=False)
    scheduler = EngineScheduler(engines)
    teacher_cfg = teacher_engine_config(engines, "/teacher", 1)
    teacher = EngineScheduler(teacher_cfg, name="teacher_engines")
    scheduler.reserve(); teacher.reserve()  # both groups hold their GPUs at once, as in a run
    out["engines"] = servers(engines, scheduler)
    out["teacher"] = servers(teacher_cfg, teacher)
    trainer.shutdown()
    print("RESULT " + json.dumps(out))
""")


def test_gpu_placement_on_a_cluster_that_declares_gpus(simulated_cluster):
    proc = subprocess.run([sys.executable, "-c", _DRIVER, simulated_cluster.address], capture_output=True,
                          text=True, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-6000:]
    out = json.loads(line[len("RESULT "):])

    actor, critic = out["actor"], out["critic"]
    # actor: ranks node by node (4 per node), each on a GPU of its own (a 0.75 share: never two per GPU)
    assert len({a["node_ip"] for a in actor[:4]}) == 1 and len({a["node_ip"] for a in actor[4:]}) == 1
    assert actor[0]["node_ip"] != actor[4]["node_ip"]
    for node in (actor[:4], actor[4:]):
        assert sorted(len(a["gpu_ids"]) for a in node) == [1] * 4
        assert len({a["gpu_ids"][0] for a in node}) == 4
        assert all(a["visible"] == a["gpu_ids"][0] for a in node)
    # critic (C4): placed at once (it used to wait for GPUs the actor's bundles held), rank i on actor i's GPU
    for a, c in zip(actor, critic):
        assert c["node_ip"] == a["node_ip"] and c["gpu_ids"] == [] and c["visible"] == a["gpu_ids"][0]
    # colocated engines: 2 per trainer node, each over the GPUs of the 2 ranks it shares, memory released
    for i, engine in enumerate(out["colocated_engines"]):
        ranks = actor[2 * i: 2 * i + 2]
        assert engine["node_ip"] == ranks[0]["node_ip"]
        assert engine["visible"] == ",".join(r["gpu_ids"][0] for r in ranks)
        assert engine["tp"] == ["2"] and engine["base_gpu"] == ["0"]
        assert engine["memory_saver"] and engine["saver_env"] == "true"
        assert engine["ifname"] == ["lo", "lo"]  # the interface of its node's address (127.0.0.x: loopback)

    # disaggregated: trainer, engines and teacher never share a GPU of a node
    taken = {}
    for who, procs in (("trainer", out["trainer"]), ("engines", out["engines"]), ("teacher", out["teacher"])):
        for p in procs:
            ids = p["gpu_ids"] if "gpu_ids" in p else p["visible"].split(",")
            for gpu in ids:
                assert (p["node_ip"], gpu) not in taken, (who, p, taken)
                taken[(p["node_ip"], gpu)] = who
    for engine in out["engines"] + out["teacher"]:
        assert len(engine["visible"].split(",")) == 2 and engine["tp"] == ["2"] and engine["base_gpu"] == ["0"]
        assert not engine["memory_saver"] and engine["saver_env"] is None
    assert len({e["node_ip"] for e in out["engines"]}) == 2  # SPREAD over nodes
