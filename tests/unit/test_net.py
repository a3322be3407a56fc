"""Ports handed to servers are picked where the kernel never hands out ports by itself."""

import socket
from pathlib import Path

import pytest

from lean_rl.utils.net import (find_free_port, interface_of, is_port_free, require_free_port,
                               set_socket_interface_env)


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


@pytest.mark.skipif(not Path("/proc/sys/net/ipv4/ip_local_port_range").is_file() or _ephemeral_low() < 21000,
                    reason="no room below this kernel's ephemeral port range")
def test_free_ports_come_from_below_the_ephemeral_range():
    ports = [find_free_port() for _ in range(20)]
    assert all(20000 <= port < _ephemeral_low() for port in ports), ports
    assert len(set(ports)) > 10  # random picks, not one fixed port that two parallel runs would share
    assert all(is_port_free(port) for port in ports)


def test_a_listening_port_is_not_free_and_the_error_names_the_flag():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", find_free_port()))
        sock.listen()
        port = sock.getsockname()[1]
        assert not is_port_free(port)
        with pytest.raises(ValueError, match=f"--router-port: port {port} on 127.0.0.1 is already in use"):
            require_free_port(port, "--router-port")


def test_socket_interface_is_the_one_holding_the_address(monkeypatch):
    import psutil

    assert interface_of("127.0.0.3") == "lo"
    assert interface_of("203.0.113.77") is None  # TEST-NET-3: held by no interface here
    for name, addresses in psutil.net_if_addrs().items():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                assert interface_of(address.address) == name
    monkeypatch.setattr("os.environ", {"NCCL_SOCKET_IFNAME": "ib0"})  # the user's choice wins
    assert set_socket_interface_env("127.0.0.2") == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "ib0"}


def test_socket_interface_env_names_the_interface_of_the_address_unless_the_user_did():
    from lean_rl.utils.net import socket_interface_env

    assert socket_interface_env("127.0.0.3", {}) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert socket_interface_env("127.0.0.3", {"NCCL_SOCKET_IFNAME": "eth9"})["NCCL_SOCKET_IFNAME"] == "eth9"
    assert socket_interface_env("203.0.113.77", {}) == {}  # no interface of this machine holds it
