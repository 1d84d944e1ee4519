"""Which user of this machine holds the other end of a loopback TCP
connection. kb/guards/connections.py tells with it whether a client is the
owner's process, for kb's servers and for the fetch guard's proxy.

Why: the servers of kb listen on loopback TCP and have no login. Every
user of the machine can reach loopback, so another user's process could
search the whole knowledge base through `kb web`, and launch runs that
execute as the owner through the Dagster UI (the red team did both as
`nobody`, 7 December 2026). The code server's socket is the owner's only
(0700), so the HTTP front must not open what the socket closes.

How: Linux tells the user that made a TCP socket (sock_diag over netlink,
as `ss -e` asks). The client's socket has the client's address as its
source and the server's address as its destination, so one exact look-up
finds it: about 16 microseconds. Not /proc/net/tcp: the kernel walks its
whole table of sockets for that file, 4 ms a read on this machine.

A connection that the kernel does not show in this network namespace (a
client in another one: a container's published port arrives from its
bridge, not from loopback), and a system without sock_diag, give None:
the other checks of the guard still apply.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NO_COOKIE = 0xFFFFFFFF
ALL_STATES = 0xFFFFFFFF
# struct inet_diag_msg after the netlink header: family, state, timer,
# retrans (4 bytes), the socket id (48), expires, rqueue, wqueue (12), uid.
UID_OFFSET = 16 + 4 + 48 + 12


def _plain(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address; one of IPv4 mapped into IPv6 (::ffff:127.0.0.1) as IPv4."""
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    return getattr(address, "ipv4_mapped", None) or address


def _look_up(family: int, source: str, source_port: int, destination: str, destination_port: int) -> int | None:
    """The uid of the TCP socket with this source and destination, or None."""
    sockid = (struct.pack("!HH", source_port, destination_port)
              + socket.inet_pton(family, source).ljust(16, b"\0")
              + socket.inet_pton(family, destination).ljust(16, b"\0")
              + struct.pack("=III", 0, NO_COOKIE, NO_COOKIE))
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, ALL_STATES) + sockid
    message = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + request
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as diag:
        diag.settimeout(1.0)
        diag.sendto(message, (0, 0))
        answer = diag.recv(8192)
    # An unknown socket gets NLMSG_ERROR (type 2) in place of the message.
    if len(answer) < UID_OFFSET + 4 or struct.unpack_from("=H", answer, 4)[0] != SOCK_DIAG_BY_FAMILY:
        return None
    return struct.unpack_from("=I", answer, UID_OFFSET)[0]


def peer_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The user id of the process that holds the client end of a loopback
    connection to `server`, or None when the client is not on loopback or
    the kernel does not show its socket here."""
    try:
        source, destination = _plain(client[0]), _plain(server[0])
    except ValueError:
        return None
    if not source.is_loopback:
        return None
    # A client of a server on "::" that connected to 127.0.0.1 may have an
    # IPv4 socket or an IPv6 one; the server sees the IPv4 address mapped
    # into IPv6 (_plain() reads it back as IPv4).
    if source.version == 4 and destination.version == 4:
        families = [(socket.AF_INET, str(source), str(destination)),
                    (socket.AF_INET6, f"::ffff:{source}", f"::ffff:{destination}")]
    elif source.version == 6 and destination.version == 6:
        families = [(socket.AF_INET6, str(source), str(destination))]
    else:
        return None
    for family, source_ip, destination_ip in families:
        try:
            uid = _look_up(family, source_ip, client[1], destination_ip, server[1])
        except OSError:  # no sock_diag (another system, a seccomp filter)
            return None
        if uid is not None:
            return uid
    return None
