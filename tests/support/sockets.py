"""The addresses this machine's TCP sockets listen on, from /proc/net (IPv4 and IPv6)."""
import ipaddress
from typing import List


def listening(port: int) -> List[str]:
    """Every local address a socket listens on at `port` ('0.0.0.0' or '::' for every interface)."""
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/net/{table}") as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                    continue
                raw = bytes.fromhex(address)  # 32-bit words in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.append(str(ipaddress.ip_address(raw)))
    return found
