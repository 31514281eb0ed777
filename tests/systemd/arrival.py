"""When one salt-key decision reached each master (tests/systemd/rolling.sh).

Usage: python3 arrival.py ID FOLDER ORIGIN TIMEOUT NAME=PKI_DIR...

Polls every 2 ms which key folder of each PKI_DIR holds ID (minions, then
minions_pre, then minions_rejected; "absent" for none), as
tests/systemd/lib.sh's folder_of does. Prints "ready" once the first poll
is done (the caller runs salt-key then), and, once every master shows FOLDER
or TIMEOUT seconds have passed, one line per other master: "NAME MS", the
milliseconds from the moment ORIGIN showed FOLDER to the moment NAME did,
or "NAME never". Exits 2 if ORIGIN itself never showed FOLDER.
"""
import os
import sys
import time

minion, want, origin, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
roots = dict(arg.split("=", 1) for arg in sys.argv[5:])


def folder(root):
    for name in ("minions", "minions_pre", "minions_rejected"):
        if os.path.lexists(os.path.join(root, name, minion)):
            return name
    return "absent"


reached = {}
deadline = time.monotonic() + timeout
first = True
while time.monotonic() < deadline:
    now = time.monotonic()
    for name, root in roots.items():
        if name not in reached and folder(root) == want:
            reached[name] = now
    if first:
        if reached:
            # Already there before the decision: the caller's mistake.
            print(f"already {want} on {', '.join(sorted(reached))} before the decision", flush=True)
            sys.exit(2)
        print("ready", flush=True)
        first = False
    if len(reached) == len(roots):
        break
    time.sleep(0.002)

if origin not in reached:
    print(f"{origin} never showed {want}", flush=True)
    sys.exit(2)
for name in roots:
    if name == origin:
        continue
    if name in reached:
        print(f"{name} {(reached[name] - reached[origin]) * 1000:.0f}")
    else:
        print(f"{name} never")
