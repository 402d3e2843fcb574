#!/usr/bin/env python3
"""A receiver that consumes many queues with a large prefetch and never
acks: it reads deliveries until it holds COUNT of them, says so on stdout,
then holds them until it is killed (its connection then closes with every
delivery still owed, which the broker gives back).

    hoarder.py ADDR CERTS CN PREFETCH COUNT QUEUE...
"""
import socket
import ssl
import sys


def main():
    addr, certs, cn, prefetch, count = sys.argv[1:6]
    queues = sys.argv[6:]
    host, port = addr.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=f"{certs}/ca.crt")
    ctx.check_hostname = False
    ctx.load_cert_chain(f"{certs}/{cn}.crt", f"{certs}/{cn}.key")
    sock = ctx.wrap_socket(socket.create_connection((host, int(port))))
    for q in queues:
        sock.sendall(f"consume {q} {prefetch}\n".encode())
    want, held, buf = int(count), 0, b""
    while held < want:
        chunk = sock.recv(1 << 20)
        if not chunk:
            sys.exit(f"hoarder: the broker closed the connection holding {held}")
        buf += chunk
        lines = buf.split(b"\n")
        buf = lines.pop()
        for line in lines:
            if line.startswith(b"Message:"):
                held += 1
            elif not line.startswith((b"OK consume", b"HELLO")):
                sys.exit(f"hoarder: unexpected line {line[:120]!r}")
    print(f"holding {held}", flush=True)
    sys.stdin.read()  # until killed or stdin closes


main()
