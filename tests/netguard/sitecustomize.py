"""Outbound network blocked and logged, for every Python process started with this folder on PYTHONPATH
(children inherit it): a name lookup or a connection to anything but loopback is refused, and written
to the file $NETGUARD_LOG as `<pid> <call> <destination> <argv>`. Unix sockets and binding are untouched.
It sees the `socket` module's calls (what requests, httpx, urllib3 and asyncio use), not native resolvers."""

import ipaddress
import os
import socket
import sys

_LOG = os.environ["NETGUARD_LOG"]
_LOCAL_NAMES = {"", "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def _local(host) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    if host is None or host.lower() in _LOCAL_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def _refuse(call: str, dest) -> None:
    with open(_LOG, "a") as fh:
        fh.write(f"{os.getpid()} {call} {dest!r} {sys.argv}\n")


_getaddrinfo = socket.getaddrinfo
_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex


def getaddrinfo(host, *args, **kwargs):
    if not _local(host):
        _refuse("getaddrinfo", host)
        raise socket.gaierror(socket.EAI_NONAME, f"netguard: lookup of {host!r} blocked")
    return _getaddrinfo(host, *args, **kwargs)


def _outbound(sock, address) -> bool:
    if sock.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
        _refuse("connect", address)
        return True
    return False


def connect(self, address):
    if _outbound(self, address):
        raise OSError(101, f"netguard: connection to {address!r} blocked")
    return _connect(self, address)


def connect_ex(self, address):
    return 101 if _outbound(self, address) else _connect_ex(self, address)


socket.getaddrinfo = getaddrinfo
socket.socket.connect = connect
socket.socket.connect_ex = connect_ex
