"""How fresh `gpuenv top -i` is: the streams of N nodes (an inventory, or N nodes emulated on
this machine), sampled at every refresh for a while.

    python benchmarks/top_refresh.py --emulate 32 [--interval 1] [--seconds 20]
    python benchmarks/top_refresh.py -i inventory/lab-mon/hosts.yml

Prints the time until every node's first frame, then per refresh: the age of the oldest newest
frame (how old the stalest row on screen is), the time to build and render the table, and the
frames' own lag (arrival here minus the node's at_unix, the same clock on emulated nodes)."""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time

from rich.console import Console

from gpuenv.cluster.inventory import Host, load
from gpuenv.health import top
from gpuenv.report.top import table


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("-i", "--inventory")
    p.add_argument("--emulate", type=int, default=0)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args()
    if args.inventory:
        hosts = load(args.inventory, None)
    else:
        hosts = [Host(f"e{i}", "127.0.0.1", "127.0.0.1", local=True, python=sys.executable)
                 for i in range(args.emulate)]  # fmt: skip
    began_at = time.monotonic()
    streams = top.Streams(hosts, args.interval).start()
    try:
        streams.wait_first(120.0)
        first_s = time.monotonic() - began_at
        missing = [n for n, v in streams.views.items() if v.frame is None]
        print(f"{len(hosts)} nodes: every first frame after {first_s:.1f} s; missing {missing}")
        ages, builds, lags = [], [], []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            time.sleep(args.interval)
            now = time.monotonic()
            ages.append(max(now - (v.at or now) for v in streams.views.values()))
            t0 = time.monotonic()
            Console(file=io.StringIO(), width=160).print(
                table(top.rows(streams.views, args.interval), "bench")
            )
            builds.append(time.monotonic() - t0)
            lags += [time.time() - v.frame["at_unix"] for v in streams.views.values() if v.frame]
        figures = (("oldest row age", ages), ("table build+render", builds), ("frame age", lags))
        for name, xs in figures:
            print(f"{name}: median {statistics.median(xs):.3f} s, max {max(xs):.3f} s"
                  f" over {len(xs)} samples")  # fmt: skip
    finally:
        streams.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
