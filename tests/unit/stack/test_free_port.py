"""A test's or benchmark's services get ports outside the kernel's ephemeral range, which Spark's worker listeners and
every client's own end draw from: a stopped service's clients, still dialing its port, never reach one of those."""

from __future__ import annotations

import socket

import pytest

from stack import services
from stack.services import EPHEMERAL_PORTS, LOWEST_SERVICE_PORT, default_ports, free_port, service_ports


def test_ports_are_picked_below_the_ephemeral_range():
    assert service_ports("32768\t60999") == range(LOWEST_SERVICE_PORT, 32768)
    assert service_ports("1024 65535") == range(0)       # no room below it: any free port
    assert service_ports(None) == range(0)
    assert service_ports("") == range(0)


def test_a_free_port_is_bindable_and_outside_this_machines_ephemeral_range():
    ephemeral = EPHEMERAL_PORTS.read_text() if EPHEMERAL_PORTS.exists() else None
    ports = {free_port() for _ in range(20)}
    allowed = service_ports(ephemeral)
    if allowed:
        assert ports <= set(allowed), ports
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_free_port_is_never_one_the_default_configuration_names(monkeypatch: pytest.MonkeyPatch):
    # Given the defaults' ports (the gateway's 8088, the cluster brokers' 19192…), a test that sets some ports to free
    # ones keeps the others: a free port equal to one of them would make the configuration refuse to load.
    assert {8088, 19192, 19193, 19194} <= default_ports()
    # When the only ports to pick from are the brokers' 19192–19197 and two more, one of the two more is picked.
    monkeypatch.setattr(services, "service_ports", lambda _: range(19192, 19200))
    assert {free_port() for _ in range(20)} <= {19198, 19199}
