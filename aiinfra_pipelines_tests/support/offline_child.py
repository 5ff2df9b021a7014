"""Run a module as ``__main__`` with the network refused, recording every attempt.

``python -m aiinfra_pipelines_tests.support.offline_child ATTEMPTS MODULE [ARGS...]`` refuses
each TCP/UDP connect to a non-loopback address and each DNS lookup of a non-local host (the
way a code server sees a cluster whose services are down), appends one line per attempt to
the file ``ATTEMPTS`` and runs ``MODULE`` as ``python -m MODULE ARGS`` would. A test asserts
the file stays empty: whether loading *tried* to reach a service is a count, not a timing.
"""

from __future__ import annotations

import ipaddress
import runpy
import socket
import sys
from pathlib import Path

LOCAL_HOSTS = {"localhost", "", None}


def _is_loopback(host: object) -> bool:
    if host in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(str(host)).is_loopback
    except ValueError:
        return False


def refuse_network(attempts: Path) -> None:
    """Refuse and record remote connects and DNS lookups in this process."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def record(what: str) -> None:
        with attempts.open("a", encoding="utf-8") as out:
            out.write(what + "\n")

    def remote(sock: socket.socket, address) -> bool:
        return sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0])

    def connect(sock: socket.socket, address, *args):
        if remote(sock, address):
            record(f"connect {address}")
            raise ConnectionRefusedError(f"network access while offline: {address}")
        return real_connect(sock, address, *args)

    def connect_ex(sock: socket.socket, address, *args):
        if remote(sock, address):
            record(f"connect_ex {address}")
            return 111
        return real_connect_ex(sock, address, *args)

    def getaddrinfo(host, *args, **kwargs):
        if not _is_loopback(host):
            record(f"getaddrinfo {host}")
            raise socket.gaierror(f"DNS lookup while offline: {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex
    socket.getaddrinfo = getaddrinfo


def main() -> None:
    attempts, module, *args = sys.argv[1:]
    refuse_network(Path(attempts))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
