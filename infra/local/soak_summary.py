"""Sums the chaos segments of `make soak` (the `chaos: {...}` lines of its log).

Usage: soak_summary.py LOG. Prints one line per segment and their total: events, owed
deliveries, lost (must be 0), duplicates, kills, AWS calls refused and the time to quiet.
"""

import json
import sys


def main(path: str) -> int:
    runs = []
    with open(path, encoding="utf-8", errors="replace") as log:
        for line in log:
            if line.startswith("chaos: {"):
                runs.append(json.loads(line[len("chaos: "):]))
    if not runs:
        print("chaos: no segment reported (see the log)", file=sys.stderr)
        return 1
    keys = ("events", "owed", "delivered", "lost", "duplicates", "misdelivered", "reordered", "kills")
    total = {k: 0 for k in keys}
    refused = 0
    seconds = 0.0
    for n, run in enumerate(runs, 1):
        calls = sum(run.get("awsCallsRefused", {}).values())
        refused += calls
        seconds += run.get("quietAfterSeconds", 0)
        for k in keys:
            total[k] += run.get(k, 0)
        print(
            f"segment {n}: {run['events']} events, seed {run.get('seed')}, lost {run['lost']}, "
            f"duplicates {run['duplicates']}, kills {run['kills']}, AWS calls refused {calls}, "
            f"quiet after {run.get('quietAfterSeconds')} s"
        )
    share = total["duplicates"] / total["owed"] if total["owed"] else 0.0
    print(
        f"chaos total: {len(runs)} segments, {total['events']} events, {total['owed']} owed, "
        f"lost {total['lost']}, misdelivered {total['misdelivered']}, reordered {total['reordered']}, "
        f"duplicates {total['duplicates']} ({share:.1%} of owed), kills {total['kills']}, "
        f"AWS calls refused {refused}, {seconds:.0f} s to quiet in all"
    )
    return 0 if total["lost"] == 0 and total["misdelivered"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
