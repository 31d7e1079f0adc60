#!/usr/bin/env python3
"""The mail statement alone, as the server sends it, under pgbench.

Takes the statement's texts from an auto_explain log (bench/profile.sh writes
one: data/profile/auto_explain.log), one file per shape, and runs each with
`pgbench -M prepared` and the pool's settings, one client, with N sends and N
polls per batch by agents of a database the bench left (its `mix-*` pairs:
sends to the partner, polls of the partner's inbox). Prints the latency per
batch. To measure a change to the statement before building it, edit a
shape's file in --dir and run again with --only that file. The tokens are
read from the database each run: a bench run recreates its agents.

    bench/statement_pgbench.py --port 25432 --log data/profile/auto_explain.log \\
        --pairs 1 4 8 --rounds 3
"""

import argparse
import pathlib
import re
import subprocess
import sys


def shapes_from_log(log: str) -> dict[str, str]:
    """One query text per shape, named by the parts it holds."""
    found = {}
    for block in re.split(r"\n(?=\S)", log):
        m = re.search(r"Query Text: (WITH woken.*)", block, re.S)
        if not m:
            continue
        lines = m.group(1).split("\n")
        text = [lines[0]]
        for line in lines[1:]:
            # The plan starts at the first node line.
            if re.match(r"\t[A-Z][A-Za-z ]+ +\(", line):
                break
            text.append(line[1:] if line.startswith("\t") else line)
        sql = "\n".join(text)
        parts = [
            name
            for name, marker in [
                ("sends", "sreq AS"),
                ("polls", "preq AS"),
                ("leases", "lease_taken AS"),
                ("acks", "areq AS"),
                ("grouped", "WINDOW same_send"),
                ("keyed", "-- Keyed: a copy a unique index holds already"),
                ("quotas", "hour_counted AS"),
            ]
            if marker in sql
        ]
        found.setdefault("-".join(parts), sql)
    return found


def psql(args, sql: str) -> list[list[str]]:
    out = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(args.port), "-U", "postgres", "-d", args.db,
         "-qtAF", "|", "-c", sql],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    return [row.split("|") for row in out.split("\n") if row]


def parameters(args, sql: str, pairs: int) -> list[str]:
    """`-D` options for pgbench: one batch of `pairs` sends and polls."""
    agents = psql(
        args,
        "SELECT name, encode(token_hash, 'hex') FROM agents "
        "WHERE unregistered_at IS NULL AND name LIKE 'mix-%' ORDER BY id LIMIT 64",
    )
    if len(agents) < 2 * pairs:
        sys.exit(f"{args.db} holds {len(agents)} mix agents; {2 * pairs} needed")
    senders, recipients = agents[0 : 2 * pairs : 2], agents[1 : 2 * pairs : 2]

    def array(items):
        return "{" + ",".join(items) + "}"

    def digests(rows):
        return array(f'"\\\\x{digest}"' for _, digest in rows)

    nulls = array(["NULL"] * pairs)
    value = {14: "{}"}
    if "sreq AS" in sql:
        value.update({
            1: digests(senders), 2: nulls, 3: array(f'"{name}"' for name, _ in recipients),
            4: nulls, 5: array(['"a-short-body-from-the-bench"'] * pairs), 6: nulls, 7: nulls,
            8: nulls, 9: nulls, 17: array(["f"] * pairs), 18: "1000000", 19: "1000000",
            20: "1000000", 21: "1000000", 22: "100", 23: nulls,
            24: array(str(n + 1) for n in range(pairs)), 29: nulls,
        })
    if "preq AS" in sql:
        value.update({
            10: digests(recipients), 11: nulls, 12: array(["10"] * pairs), 13: "100",
            15: nulls, 16: nulls, 28: "1000000",
        })
    used = sorted({int(n) for n in re.findall(r"\$(\d+)", sql)})
    missing = [n for n in used if n not in value]
    if missing:
        sys.exit(f"no value for ${missing} (acknowledgements are not generated)")
    return [f"-Dp{n}={value[n]}" for n in used]


# A new key per copy and execution, for --fresh-keys: every copy is stored,
# as for a client whose keys are new (the same key each time would make
# every execution after the first a replay).
FRESH_KEYS = "array(SELECT md5(random()::text) FROM generate_series(1, cardinality($3::text[])))"


def with_fresh_keys(sql: str) -> str:
    """The keys ($8) and their other form ($29) made fresh in the statement."""
    return sql.replace("$8::text[]", FRESH_KEYS).replace("$29::text[]", FRESH_KEYS)


def script(sql: str) -> str:
    """pgbench wants one line per statement and :names for parameters."""
    sql = re.sub(r"--[^\n]*", "", sql)
    sql = re.sub(r"\$(\d+)", lambda m: ":p" + m.group(1), sql)
    return " ".join(sql.split()) + ";\n"


def latency(args, path: pathlib.Path, pairs: int) -> float:
    sql = path.read_text()
    if args.fresh_keys:
        sql = with_fresh_keys(sql)
    bench = path.with_suffix(f".{pairs}.pgbench")
    bench.write_text(script(sql))
    env = {"PGOPTIONS": "-c plan_cache_mode=force_generic_plan -c jit=off -c enable_seqscan=off"}
    out = subprocess.run(
        ["pgbench", "-h", "127.0.0.1", "-p", str(args.port), "-U", "postgres", "-n",
         "-M", "prepared", "-c", "1", "-T", str(args.seconds),
         *parameters(args, sql, pairs), "-f", str(bench), args.db],
        capture_output=True, text=True, env={**__import__("os").environ, **env},
    )
    m = re.search(r"latency average = ([0-9.]+) ms", out.stdout)
    failed = re.search(r"number of failed transactions: (\d+)", out.stdout)
    if not m or (failed and failed.group(1) != "0"):
        sys.exit(f"{path.name}: pgbench failed:\n{out.stdout}\n{out.stderr}")
    return float(m.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=25432)
    p.add_argument("--db", default="phone_bench")
    p.add_argument("--log", help="auto_explain log to take the shapes from")
    p.add_argument("--dir", default="data/statement-pgbench")
    p.add_argument("--only", nargs="*", help="shape files in --dir to run")
    p.add_argument("--pairs", type=int, nargs="+", default=[4])
    p.add_argument("--seconds", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fresh-keys", action="store_true",
                   help="keyed shapes: a new idempotency key per copy and execution")
    args = p.parse_args()
    folder = pathlib.Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    if args.log:
        for name, sql in shapes_from_log(pathlib.Path(args.log).read_text()).items():
            (folder / f"{name}.sql").write_text(sql)
    files = [folder / f for f in args.only] if args.only else sorted(folder.glob("*.sql"))
    files = [f for f in files if "acks" not in f.name]
    print("| shape | pairs | latency per batch, ms (rounds, alternated) |")
    print("|---|---|---|")
    results = {}
    for _ in range(args.rounds):
        for pairs in args.pairs:
            for f in files:
                results.setdefault((f.stem, pairs), []).append(latency(args, f, pairs))
    for (name, pairs), runs in results.items():
        print(f"| {name} | {pairs} | " + " · ".join(f"{r:.3f}" for r in runs) + " |")


if __name__ == "__main__":
    main()
