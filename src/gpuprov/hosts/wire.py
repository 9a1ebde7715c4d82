"""The connection SSH runs over: gpuprov makes the TCP connection itself (without a ProxyJump gateway) with
both of the kernel's small-packet delays off, and asks for AES-GCM first."""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import paramiko


def connect_tcp(host: str, port: int, timeout: float) -> socket.socket:
    """The TCP connection SSH runs over, made here rather than by paramiko so that both of the kernel's small-packet
    delays are off from the first byte. The key exchange, authentication and a channel's opening are exchanges of
    small packets, sent two in a row at times, and each such pair waited for a delayed ACK: with Nagle on ours
    (paramiko turns it off nowhere) and on sshd's side, a connection and its first command took several times
    as long on a local host."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if hasattr(socket, "TCP_QUICKACK"):
        sock.__class__ = _QuickAckSocket
    return sock


AEAD_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def aead_transport(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """paramiko's Transport, asking for AES-GCM before its default AES-CTR: one authenticated encryption per
    packet instead of AES plus an HMAC whose check paramiko does byte by byte in Python. OpenSSH offers both
    (the client's order decides); a server without GCM still gets the rest of the list."""
    transport = paramiko.Transport(sock, **kwargs)
    options = transport.get_security_options()
    offered = tuple(options.ciphers)
    options.ciphers = tuple(c for c in AEAD_FIRST if c in offered) + tuple(c for c in offered if c not in AEAD_FIRST)
    return transport


class _QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges what it reads at once (TCP_QUICKACK, re-armed after every read, since Linux
    goes back to delayed ACKs by itself). sshd leaves Nagle on and, after authentication, sends two small packets
    in a row (the answer, then its host keys); the second waits for our ACK of the first, and its channel-open
    answer waits behind it."""

    __slots__ = ()

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        with contextlib.suppress(OSError):  # closed under us: the next read says so
            self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return data
