"""A cluster job's network facts, as the replica's computer sees them (docs/cluster-jobs.md, "What the
agent does"):

    free-port           -> a TCP port free on this computer now (MASTER_PORT on main1's computer)
    resolve NAME...     -> one JSON line {NAME: address}, resolved by this computer's resolver"""
import json
import socket
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def resolve(names):
    return {name: socket.gethostbyname(name) for name in names}


def main(argv):
    if argv[:1] == ["free-port"]:
        print(free_port())
    elif argv[:1] == ["resolve"]:
        print(json.dumps(resolve(argv[1:])))
    else:
        sys.stderr.write("usage: net.py free-port | resolve NAME...\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
