import argparse

import pytest

from lean_rl.backends.sglang.config import DEFAULT_CPU_MAX_TOTAL_TOKENS, EngineConfig
from lean_rl.backends.sglang.server_command import router_flags, server_flags
from lean_rl.backends.sglang.ports_and_key import resolve_ports
from lean_rl.backends.sglang.command_line import split_passthrough
from lean_rl.backends.sglang.launch import device_from_argv
from lean_rl.options import ConfigError, add_options, build, read_options


def parse(argv, device="cpu"):
    parser = add_options(argparse.ArgumentParser(allow_abbrev=False), EngineConfig)
    args, unknown = parser.parse_known_args(argv)
    passthrough = split_passthrough(unknown)
    config = read_options(EngineConfig, args, device=device, server_passthrough=passthrough.server,
                          router_passthrough=passthrough.router)
    return config, passthrough


def flag_values(flags, name):
    """Values after `name` in a flat flag list (asserts the flag appears exactly once)."""
    positions = [i for i, token in enumerate(flags) if token == name]
    assert len(positions) == 1, f"{name} appears {len(positions)} times in {flags}"
    values = []
    for token in flags[positions[0] + 1 :]:
        if token.startswith("--"):
            break
        values.append(token)
    return values


def test_split_passthrough_strips_prefixes_and_keeps_values_with_their_flag():
    split = split_passthrough(
        ["--sglang-enable-foo", "--sglang-chunked-prefill-size", "512", "--router-policy", "round_robin",
         "--lr", "1e-5", "--sglang-json={'a': 1}", "--router-selector", "a=b", "c=d", "--sglang-offset", "-3"]
    )
    assert split.server == ("--enable-foo", "--chunked-prefill-size", "512", "--json={'a': 1}", "--offset", "-3")
    assert split.router == ("--policy", "round_robin", "--selector", "a=b", "c=d")
    assert split.rest == ("--lr", "1e-5")


def test_cpu_config_has_the_cpu_flags_and_user_passthrough_replaces_a_default():
    config, _ = parse(["--hf-checkpoint", "/m", "--rollout-num-engines", "2", "--sglang-dtype", "bfloat16",
                       "--sglang-chunked-prefill-size", "256", "--router-policy", "round_robin"])
    assert config.num_engines == 2 and config.device == "cpu"
    flags = server_flags(config, 1, 31001)
    assert flag_values(flags, "--model-path") == ["/m"]
    assert flag_values(flags, "--port") == ["31001"]
    assert flag_values(flags, "--host") == ["127.0.0.1"]
    assert flag_values(flags, "--device") == ["cpu"]
    assert flag_values(flags, "--attention-backend") == ["torch_native"]
    assert flag_values(flags, "--dtype") == ["bfloat16"]  # the user's value, once
    assert flag_values(flags, "--max-total-tokens") == [str(DEFAULT_CPU_MAX_TOTAL_TOKENS)]
    assert flag_values(flags, "--sleep-on-idle") == []
    assert flag_values(flags, "--chunked-prefill-size") == ["256"]
    assert "--tp-size" not in flags

    router = router_flags(config, 30100, 29100)
    assert flag_values(router, "--prometheus-host") == ["127.0.0.1"]
    assert flag_values(router, "--host") == ["127.0.0.1"]
    assert flag_values(router, "--port") == ["30100"]
    assert flag_values(router, "--policy") == ["round_robin"]


def test_explicit_flags_reach_the_server():
    config, _ = parse(["--hf-checkpoint", "/m", "--sglang-max-total-tokens", "4096",
                       "--sglang-mem-fraction-static", "0.5", "--sglang-base-port", "31000", "--router-port", "31100",
                       "--engine-start-timeout", "60", "--engine-request-timeout", "30"])
    flags = server_flags(config, 0, 31000)
    assert flag_values(flags, "--max-total-tokens") == ["4096"]
    assert flag_values(flags, "--mem-fraction-static") == ["0.5"]
    assert (config.base_port, config.router_port) == (31000, 31100)
    assert (config.start_timeout_s, config.request_timeout_s) == (60.0, 30.0)


def test_gpu_engines_are_derived_from_gpu_counts():
    config, _ = parse(["--hf-checkpoint", "/m", "--rollout-num-gpus", "8", "--rollout-num-gpus-per-engine", "2"],
                      device="cuda")
    assert config.num_engines == 4
    flags = server_flags(config, 3, 30000)
    assert flag_values(flags, "--tp-size") == ["2"]
    assert flag_values(flags, "--base-gpu-id") == ["6"]
    assert "--device" not in flags and "--sleep-on-idle" not in flags and "--max-total-tokens" not in flags


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--rollout-num-gpus", "6", "--rollout-num-gpus-per-engine", "4"], "--rollout-num-gpus"),
        (["--rollout-num-gpus", "8", "--rollout-num-gpus-per-engine", "2", "--rollout-num-engines", "3"],
         "--rollout-num-engines"),
        (["--rollout-num-gpus-per-engine", "0"], "--rollout-num-gpus-per-engine"),
    ],
)
def test_inconsistent_gpu_counts_name_the_flag(argv, flag):
    with pytest.raises(ConfigError, match=f"^{flag}:"):
        parse(["--hf-checkpoint", "/m", *argv], device="cuda")


@pytest.mark.parametrize(
    "argv, flag",
    [
        ([], "--hf-checkpoint"),
        (["--hf-checkpoint", "/m", "--rollout-num-engines", "0"], "--rollout-num-engines"),
        (["--hf-checkpoint", "/m", "--sglang-mem-fraction-static", "1.5"], "--sglang-mem-fraction-static"),
        (["--hf-checkpoint", "/m", "--sglang-max-total-tokens", "0"], "--sglang-max-total-tokens"),
        (["--hf-checkpoint", "/m", "--sglang-base-port", "80"], "--sglang-base-port"),
        (["--hf-checkpoint", "/m", "--router-port", "70000"], "--router-port"),
        (["--hf-checkpoint", "/m", "--rollout-num-engines", "2", "--sglang-base-port", "31000", "--router-port",
          "31001"], "--router-port"),
        (["--hf-checkpoint", "/m", "--engine-start-timeout", "0"], "--engine-start-timeout"),
        (["--hf-checkpoint", "/m", "--engine-request-timeout", "-1"], "--engine-request-timeout"),
        (["--hf-checkpoint", "/m", "--sglang-port", "1234"], "--sglang-port"),
        (["--hf-checkpoint", "/m", "--sglang-model-path", "/x"], "--sglang-model-path"),
        (["--hf-checkpoint", "/m", "--router-worker-urls", "http://x"], "--router-worker-urls"),
        (["--hf-checkpoint", "/m", "--router-host", "0.0.0.0"], "--router-host"),
    ],
)
def test_invalid_flags_raise_errors_that_name_the_flag(argv, flag):
    with pytest.raises(ConfigError, match=f"^{flag}:"):
        parse(argv)


def test_managed_flag_error_points_at_the_right_flag():
    with pytest.raises(ConfigError, match="--sglang-base-port"):
        parse(["--hf-checkpoint", "/m", "--sglang-port", "1234"])


def test_declared_sglang_flags_win_over_passthrough():
    config, passthrough = parse(["--hf-checkpoint", "/m", "--sglang-host", "127.0.0.5",
                                 "--sglang-mem-fraction-static=0.4", "--sglang-dtype", "float32"])
    assert passthrough.server == ("--dtype", "float32")
    assert config.host == "127.0.0.5" and config.mem_fraction_static == 0.4
    flags = server_flags(config, 0, 31000)
    assert flag_values(flags, "--host") == ["127.0.0.5"] and flag_values(flags, "--mem-fraction-static") == ["0.4"]


def test_ports_are_chosen_by_resolve_ports_not_by_the_config(monkeypatch):
    import lean_rl.backends.sglang.ports_and_key as engine_config

    picked = iter([31005, 31001, 31007])  # 31001 is an engine port: skipped
    monkeypatch.setattr(engine_config, "find_free_port", lambda host: next(picked))
    config, _ = parse(["--hf-checkpoint", "/m", "--rollout-num-engines", "2", "--sglang-base-port", "31000"])
    assert (config.engine_ports, config.resolved_router_port) == ((), None)  # constructing picks nothing
    with pytest.raises(ConfigError, match="resolve_ports"):
        config.router_url
    resolved = resolve_ports(config)
    assert resolved.engine_ports == (31000, 31001) and resolved.resolved_router_port == 31005
    assert resolved.engine_urls == ("http://127.0.0.1:31000", "http://127.0.0.1:31001")
    assert resolved.router_url == "http://127.0.0.1:31005"
    assert resolve_ports(resolved) is resolved  # chosen once
    assert resolved.num_engines == 2 and resolved.threads_per_cpu_engine == config.threads_per_cpu_engine

    fixed = resolve_ports(parse(["--hf-checkpoint", "/m", "--sglang-base-port", "32000", "--router-port", "32100"])[0])
    assert (fixed.engine_ports, fixed.resolved_router_port) == ((32000,), 32100)
    monkeypatch.undo()  # real free ports: distinct
    free = resolve_ports(build(EngineConfig, model_path="/m", num_engines=2, device="cpu"))
    assert len(set(free.engine_ports) | {free.resolved_router_port}) == 3


def test_config_is_frozen():
    config = build(EngineConfig, model_path="/m", num_engines=1, device="cpu")
    with pytest.raises(AttributeError):
        config.num_engines = 2


@pytest.mark.parametrize(
    "argv, device",
    [(["--device", "cpu"], "cpu"), (["--port", "1", "--device=cpu"], "cpu"), (["--device", "cuda"], "cuda"),
     (["--model-path", "/m"], None), (["--device"], None)],
)
def test_launcher_reads_the_device_from_argv(argv, device):
    assert device_from_argv(argv) == device


def test_cpu_engines_share_the_cores_with_one_share_left_for_the_trainer(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert build(EngineConfig, model_path="/m", num_engines=1, device="cpu").threads_per_cpu_engine == 8
    assert build(EngineConfig, model_path="/m", num_engines=3, device="cpu").threads_per_cpu_engine == 4
    assert build(EngineConfig, model_path="/m", num_engines=20, device="cpu").threads_per_cpu_engine == 1
    no_auth = {"api_key": ""}  # --sglang-api-key none (tests/unit/test_sglang_api_key.py: with a key)
    assert build(EngineConfig, model_path="/m", num_engines=1, device="cpu", **no_auth).server_env() == {
        "OMP_NUM_THREADS": "8"}
    assert build(EngineConfig, model_path="/m", num_engines=1, device="cuda", gpus_per_engine=1, **no_auth).server_env() == {}
    config, _ = parse(["--hf-checkpoint", "/m", "--rollout-num-engines", "2", "--engine-cpu-threads", "6"])
    assert config.threads_per_cpu_engine == 6
    with pytest.raises(ConfigError, match="--engine-cpu-threads: must be >= 1, got 0"):
        parse(["--hf-checkpoint", "/m", "--engine-cpu-threads", "0"])


def test_on_a_cluster_the_urls_are_the_ones_the_engines_reported():
    config = resolve_ports(parse(["--hf-checkpoint", "/m", "--rollout-num-engines", "2"])[0])
    assert config.on_cluster is False and config.engine_urls[0].startswith("http://127.0.0.1:")
    import dataclasses

    reported = dataclasses.replace(config, on_cluster=True)
    reported.live.publish(("http://10.0.0.2:4000", "http://10.0.0.3:4000"), "http://10.0.0.1:5000")
    assert reported.engine_urls == ("http://10.0.0.2:4000", "http://10.0.0.3:4000")
    assert reported.router_url == "http://10.0.0.1:5000"


def test_engine_nodes_need_a_cluster_and_one_node_per_engine():
    import dataclasses

    config = parse(["--hf-checkpoint", "/m", "--rollout-num-engines", "2"])[0]
    with pytest.raises(ConfigError, match="engine nodes"):
        dataclasses.replace(config, engine_nodes=("10.0.0.2", "10.0.0.3"))
    with pytest.raises(ConfigError, match="2 engines"):
        dataclasses.replace(config, on_cluster=True, engine_nodes=("10.0.0.2",))
    assert dataclasses.replace(config, on_cluster=True, engine_nodes=("10.0.0.2", "10.0.0.3")).engine_nodes


def test_engine_actor_binds_its_own_host_and_port_and_gpu_zero(monkeypatch):
    import dataclasses

    from lean_rl.backends.sglang import engine_actor

    monkeypatch.setattr(engine_actor, "service_host", lambda on_cluster: "10.0.0.7")
    monkeypatch.setattr(engine_actor, "find_free_port", lambda host: 41234)
    gpu = parse(["--hf-checkpoint", "/m", "--rollout-num-gpus", "4", "--rollout-num-gpus-per-engine", "2"],
                device="cuda")[0]
    actor = engine_actor.EngineActor(dataclasses.replace(gpu, on_cluster=True), 1, "/tmp/unused/engine-1.log")
    try:
        assert actor.url() == "http://10.0.0.7:41234"
        flags = actor._server_flags()
        assert flag_values(flags, "--host") == ["10.0.0.7"] and flag_values(flags, "--port") == ["41234"]
        assert flag_values(flags, "--base-gpu-id") == ["0"] and flag_values(flags, "--tp-size") == ["2"]
        assert actor.alive() is False and actor.tree_pids() == [] and actor.log_tail() == ""
    finally:
        actor.shutdown()


def test_on_one_node_an_engine_actor_binds_the_runs_host_and_port():
    from lean_rl.backends.sglang import engine_actor

    config = resolve_ports(parse(["--hf-checkpoint", "/m", "--rollout-num-engines", "2"])[0])
    actor = engine_actor.EngineActor(config, 1, "/tmp/unused/engine-1.log")
    try:
        assert actor.url() == config.engine_urls[1] and actor.url().startswith("http://127.0.0.1:")
    finally:
        actor.shutdown()


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_binding_every_interface_is_refused(host):
    with pytest.raises(ConfigError, match="--sglang-host: .* every interface"):
        parse(["--hf-checkpoint", "/m", "--sglang-host", host])
