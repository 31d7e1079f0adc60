#!/usr/bin/env python3
"""The replica's CPU by kind of work, from a flat `perf report --sort dso,sym`.

    perf report -i data/profile/mix-r1-c16.flat.data --stdio --no-children \
        -g none --pid PID --sort dso,sym | bench/perf_categories.py

A symbol goes to the first kind whose pattern it matches, in this order
(a generic's name carries its parameters: `rmcp::...<phone::...>` is rmcp's).
"""
import collections
import re
import sys

KINDS = [
    ("rmcp (MCP service, streamable HTTP)", r"^\S+\s+\[\.\]\s+<?rmcp|rmcp::"),
    ("allocation (mimalloc)", r"\bmi_|_mi_|\bmalloc|\bfree\b|realloc"),
    ("memmove/memcpy/memset/memcmp", r"mem(move|cpy|set|cmp)"),
    ("kernel (sockets, scheduling, futex)", r"\[k\]"),
    ("serde / serde_json", r"serde"),
    ("tokio-postgres / postgres-protocol", r"tokio_postgres::|postgres_protocol::|postgres_types::"),
    ("tracing / metrics / opentelemetry", r"tracing|metrics|opentelemetry"),
    ("hyper / http / axum / tower-http", r"hyper|\bhttp::|httparse|axum|tower_http|tower::|bytes::"),
    ("tokio runtime, sync, cancellation", r"tokio|parking_lot|crossbeam|std::sync|futex"),
    ("phone (own code)", r"phone::"),
    ("core/alloc/std (other)", r"core::|alloc::|std::"),
]


def main():
    total = 0.0
    by = collections.Counter()
    tops = collections.defaultdict(list)
    for line in sys.stdin:
        m = re.match(r"\s*([\d.]+)%\s+(.*)", line)
        if not m:
            continue
        pct, rest = float(m.group(1)), m.group(2)
        total += pct
        kind = next((k for k, rx in KINDS if re.search(rx, rest)), "other")
        by[kind] += pct
        tops[kind].append((pct, rest.split(None, 2)[-1][:110]))
    print(f"| kind of work | share of the replica's CPU | hottest symbols |")
    print("|---|---|---|")
    for kind, pct in by.most_common():
        hot = "; ".join(f"`{s}` {p / total * 100:.1f}%" for p, s in sorted(tops[kind], reverse=True)[:2])
        print(f"| {kind} | {pct / total * 100:.1f}% | {hot} |")


if __name__ == "__main__":
    main()
