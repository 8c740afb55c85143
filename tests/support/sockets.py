"""The addresses this machine's TCP sockets listen on, from /proc/net (IPv4 and IPv6), and which process holds
each (from /proc/PID/fd)."""
import ipaddress
import os
from typing import Dict, Iterable, List, Tuple


def _listeners(proc: str = "/proc/self") -> Dict[int, Tuple[str, int]]:
    """Every listening TCP socket of the network namespace of process `proc` (a /proc folder): its inode -> (local
    address, port)."""
    found = {}
    for table in ("tcp", "tcp6"):
        with open(f"{proc}/net/{table}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] != "0A":  # 0A: LISTEN
                    continue
                address, hex_port = fields[1].split(":")
                raw = bytes.fromhex(address)  # 32-bit words in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found[int(fields[9])] = (str(ipaddress.ip_address(raw)), int(hex_port, 16))
    return found


def listening(port: int) -> List[str]:
    """Every local address a socket listens on at `port` ('0.0.0.0' or '::' for every interface)."""
    return [address for address, p in _listeners().values() if p == port]


def listening_of(pids: Iterable[int]) -> List[Tuple[int, str, str, int]]:
    """(pid, command, address, port) of every listening TCP socket the processes `pids` hold, each seen in its own
    network namespace."""
    tables, found = {}, []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                command = f.read().strip()
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            namespace = os.stat(f"/proc/{pid}/ns/net").st_ino
            sockets = tables.get(namespace) or tables.setdefault(namespace, _listeners(f"/proc/{pid}"))
        except OSError:  # gone meanwhile
            continue
        for link in links:
            if link.startswith("socket:[") and int(link[8:-1]) in sockets:
                found.append((pid, command, *sockets[int(link[8:-1])]))
    return found


def on_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or getattr(ip, "ipv4_mapped", None) is not None and ip.ipv4_mapped.is_loopback
