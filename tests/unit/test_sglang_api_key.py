"""--sglang-api-key: one key per run for every SGLang server and the router, chosen once, never on a
command line, never in a repr (tests/integration/test_sglang_auth.py checks the real services)."""

import argparse
import dataclasses
import json

import pytest

from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.backends.sglang.ports_and_key import resolve_api_key, resolve_ports
from lean_rl.backends.sglang.api_keys import API_KEY_ENV, CHILD_API_KEY_ENV, NO_API_KEY, auth_headers
from lean_rl.backends.sglang.command_line import split_passthrough
from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.router import RouterAdmin
from lean_rl.backends.sglang.server_command import router_command, server_flags
from lean_rl.options import ConfigError, add_options, build, read_options

KEY = "k3y-For_tests.0123456789"


def parse(argv, environ=None, device="cpu"):
    """As config.parse_config does it: flags, passthrough, then the ports and the key chosen."""
    parser = add_options(argparse.ArgumentParser(allow_abbrev=False), EngineConfig)
    args, unknown = parser.parse_known_args(["--hf-checkpoint", "/m", *argv])
    passthrough = split_passthrough(unknown)
    config = read_options(EngineConfig, args, device=device, server_passthrough=passthrough.server,
                          router_passthrough=passthrough.router)
    return resolve_api_key(resolve_ports(config), environ={} if environ is None else environ), passthrough


def all_argv(config):
    return [*server_flags(config, 0, 30000), *router_command(config, 30001, 30002)]


@pytest.mark.parametrize("argv", [["--sglang-api-key", KEY], [f"--sglang-api-key={KEY}"]])
def test_the_flag_sets_the_key_and_never_reaches_the_passthrough(argv):
    config, passthrough = parse([*argv, "--sglang-dtype", "float32"])
    assert config.api_key == KEY
    assert passthrough.server == ("--dtype", "float32") and not passthrough.rest
    assert config.auth_headers() == {"Authorization": f"Bearer {KEY}"}


def test_the_environment_variable_when_no_flag_and_the_flag_wins_over_it():
    assert parse([], environ={API_KEY_ENV: KEY})[0].api_key == KEY
    assert parse(["--sglang-api-key", "other"], environ={API_KEY_ENV: KEY})[0].api_key == "other"


def test_without_flag_or_variable_every_run_gets_its_own_random_key_chosen_once():
    first, second = parse([])[0], parse([])[0]
    assert len(first.api_key) >= 40 and first.api_key != second.api_key
    assert resolve_api_key(first, environ={API_KEY_ENV: KEY}) is first  # chosen once
    # the key survives the copies the engine group makes (reported URLs, another host)
    assert dataclasses.replace(first, host="10.0.0.1").api_key == first.api_key


@pytest.mark.parametrize("argv, environ", [(["--sglang-api-key", "none"], {}), (["--sglang-api-key", "None"], {}),
                                           ([], {API_KEY_ENV: "none"}), (["--sglang-api-key", "none"], {API_KEY_ENV: KEY})])
def test_none_turns_authentication_off(argv, environ):
    config = parse(argv, environ=environ)[0]
    assert config.api_key == NO_API_KEY
    assert config.auth_headers() == {} and CHILD_API_KEY_ENV not in config.server_env()
    assert config.router_env() == {}


@pytest.mark.parametrize("argv, environ", [(["--sglang-api-key", ""], {}), (["--sglang-api-key", "a b"], {}),
                                           ([], {API_KEY_ENV: "s\u00e9cret"})])
def test_a_key_that_cannot_be_an_http_header_is_refused_without_echoing_it(argv, environ):
    with pytest.raises(ConfigError, match="printable ASCII") as info:
        parse(argv, environ=environ)
    assert "a b" not in str(info.value) and "s\u00e9cret" not in str(info.value)


def test_the_key_is_in_no_repr_and_on_no_command_line_only_in_the_childrens_environment():
    config = parse(["--sglang-api-key", KEY])[0]
    assert KEY not in repr(config) and KEY not in str(config)
    assert KEY not in " ".join(all_argv(config))
    assert router_command(config, 30001, 30002)[1:3] == ["-m", "lean_rl.backends.sglang.launch_router"]
    assert config.server_env()[CHILD_API_KEY_ENV] == KEY and config.router_env() == {CHILD_API_KEY_ENV: KEY}
    assert KEY not in repr(EngineClient("http://127.0.0.1:1", api_key=KEY))
    assert KEY not in repr(RouterAdmin("http://127.0.0.1:1", api_key=KEY))


def test_an_unresolved_key_is_an_error_not_silently_no_authentication():
    config = build(EngineConfig, model_path="/m", num_engines=1, device="cpu")
    for call in (config.auth_headers, config.server_env, config.router_env):
        with pytest.raises(ConfigError, match="resolve_api_key"):
            call()
    assert auth_headers(None) == {} and auth_headers("") == {}


@pytest.mark.parametrize("flag, message", [
    (["--sglang-api-key=x", "--router-api-key", "y"], "--router-api-key: is set by lean_rl; use --sglang-api-key"),
    (["--sglang-admin-api-key", "y"], "--sglang-admin-api-key: is set by lean_rl"),
    (["--sglang-tokenizer-worker-num", "2"], "--sglang-tokenizer-worker-num: SGLang checks API keys with one"),
    (["--sglang-grpc-port", "40000"], "--sglang-grpc-port: SGLang's gRPC listener does not check API keys"),
])
def test_flags_that_would_bypass_or_fight_the_key_are_refused(flag, message):
    with pytest.raises(ConfigError, match=message):
        parse(flag)


def test_without_authentication_sglang_features_that_ignore_keys_are_allowed():
    config = parse(["--sglang-api-key", "none", "--sglang-tokenizer-worker-num", "2"])[0]
    assert config.api_key == NO_API_KEY


def test_parse_config_chooses_the_key_once(tiny_qwen2, tmp_path, monkeypatch):
    from lean_rl.config import parse_config

    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "label": "x"}) + "\n")
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data)]
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    generated = parse_config(base).engines
    assert generated.api_key and generated.api_key != parse_config(base).engines.api_key
    monkeypatch.setenv(API_KEY_ENV, KEY)
    assert parse_config(base).engines.api_key == KEY
    assert parse_config([*base, "--sglang-api-key", "none"]).engines.api_key == NO_API_KEY


# the clients send the key (only to a listener of the run): tests/unit/test_listener_check.py


def test_the_key_file_is_the_documented_way(tmp_path):
    (tmp_path / "key").write_text(f"{KEY}\n")
    (tmp_path / "key").chmod(0o600)
    config = parse(["--sglang-api-key-file", str(tmp_path / "key")], environ={API_KEY_ENV: "other"})[0]
    assert config.api_key == KEY and config.api_key_file is None
    assert KEY not in " ".join(all_argv(config)) and KEY not in repr(config)


@pytest.mark.parametrize("content, error", [(None, "cannot read it"), ("", "the file is empty"),
                                            ("two words\n", "an API key is printable ASCII without spaces")])
def test_a_bad_key_file_is_one_line_naming_the_flag_and_the_file(tmp_path, content, error):
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
        path.chmod(0o600)
    with pytest.raises(ConfigError, match=f"--sglang-api-key-file {path}: {error}"):
        parse(["--sglang-api-key-file", str(path)])


def test_the_flag_and_the_file_exclude_each_other(tmp_path):
    (tmp_path / "key").write_text(KEY)
    with pytest.raises(ConfigError, match="not both"):
        parse(["--sglang-api-key", KEY, "--sglang-api-key-file", str(tmp_path / "key")])


def test_a_key_typed_on_the_command_line_warns(tiny_qwen2, tmp_path, caplog):
    from lean_rl.config import parse_config

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi", "label": "x"}) + "\n")
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(prompts)]
    with caplog.at_level("WARNING", logger="lean_rl.config"):
        parse_config([*base, "--sglang-api-key", KEY])
    assert any("shows in `ps`" in r.getMessage() and KEY not in r.getMessage() for r in caplog.records)
    caplog.clear()
    (tmp_path / "key").write_text(KEY)
    (tmp_path / "key").chmod(0o600)
    with caplog.at_level("WARNING", logger="lean_rl.config"):
        parse_config([*base, "--sglang-api-key-file", str(tmp_path / "key")])
    assert not [r for r in caplog.records if "shows in `ps`" in r.getMessage()]


def test_ray_without_token_auth_is_named():
    from lean_rl.utils.ray_utils import ray_auth_warning

    assert "RAY_AUTH_MODE=disabled" in ray_auth_warning({"RAY_AUTH_MODE": "disabled"})
    assert ray_auth_warning({}) is None and ray_auth_warning({"RAY_AUTH_MODE": "token"}) is None
