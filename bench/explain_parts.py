#!/usr/bin/env python3
"""The batch statement's time and buffers per part (CTE), from auto_explain.

    bench/explain_parts.py data/profile/auto_explain.log

Reads every logged plan of the send+poll batch statement (EXPLAIN ANALYZE,
BUFFERS, as auto_explain logs it under load), takes each CTE's top node
(actual total time x loops, shared buffers hit + read) and prints, per
part, the mean per statement and per call (the statement's calls: its
rows of sends plus its polls), with the statement's total and the part of
it no CTE accounts for (executor start-up and shut-down, the final sort).
A CTE's time includes the CTEs it reads that ran inside it (PostgreSQL
runs a CTE when first read), so parts can overlap; buffers likewise.
"""
import re
import sys
from collections import defaultdict

ENTRY = re.compile(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
NODE = re.compile(r"actual time=[\d.]+\.\.([\d.]+) rows=(\d+) loops=(\d+)")


def parts(plan):
    """(name, ms, buffers) of each CTE, and the statement's own."""
    lines = plan.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"\s*CTE (\w+)\s*$", line)
        if not m:
            continue
        node = NODE.search(lines[i + 1])
        ms = float(node.group(1)) * int(node.group(3)) if node else 0.0
        buffers = 0
        indent = len(lines[i + 1]) - len(lines[i + 1].lstrip())
        for follow in lines[i + 2:]:
            if len(follow) - len(follow.lstrip()) <= indent:
                break
            b = re.match(r"\s*Buffers: shared hit=(\d+)(?: read=(\d+))?", follow)
            if b:
                buffers = int(b.group(1)) + int(b.group(2) or 0)
                break
        out.append((m.group(1), ms, buffers))
    return out


def main(path):
    log = open(path, encoding="utf-8", errors="replace").read()
    plans = [e for e in ENTRY.split(log)
             if "duration:" in e and "Insert on messages" in e and "CTE woken" in e]
    if not plans:
        print("no plan of the batch statement in", path)
        return
    total_ms = total_buf = calls = top_ms = 0.0
    by_part = defaultdict(lambda: [0.0, 0.0])
    order = []
    for e in plans:
        duration = float(re.search(r"duration: ([\d.]+) ms", e).group(1))
        top = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", e)
        sends = re.search(r"CTE sreq\n\s*->.*?rows=(\d+) loops", e)
        polls = re.search(r"CTE me\n\s*->.*?rows=(\d+) loops", e)
        n = (int(sends.group(1)) if sends else 0) + (int(polls.group(1)) if polls else 0)
        total_ms += duration
        # The plan's top node: the first line with a cost after the query text.
        first = re.search(r"\n\s*(?:->\s*)?\w[^\n]*\(cost=[^\n]*actual time=[\d.]+\.\.([\d.]+)", e)
        top_ms += float(first.group(1)) if first else duration
        total_buf += int(top.group(1)) + int(top.group(2) or 0) if top else 0
        calls += n
        for name, ms, buf in parts(e):
            if name not in by_part:
                order.append(name)
            by_part[name][0] += ms
            by_part[name][1] += buf
    k = len(plans)
    print(f"{k} plans of the batch statement, {calls / k:.1f} calls each on average")
    print(f"statement: {total_ms / k * 1000:.0f} µs and {total_buf / k:.0f} buffers per execution;"
          f" {total_ms / calls * 1000:.0f} µs and {total_buf / calls:.1f} buffers per call")
    print(f"of which in the plan's nodes: {top_ms / k * 1000:.0f} µs per execution; the rest,"
          f" {(total_ms - top_ms) / k * 1000:.0f} µs, is executor start-up and shut-down"
          f" (initialising and freeing the plan's nodes)")
    print()
    print("| part (CTE) | µs per statement | µs per call | buffers per call |")
    print("|---|---|---|---|")
    for name in order:
        ms, buf = by_part[name]
        print(f"| {name} | {ms / k * 1000:.0f} | {ms / calls * 1000:.1f} | {buf / calls:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])
