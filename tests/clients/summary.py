"""Prints the per-check summary of a run and its closing count line.

    python3 summary.py RESULTS_FILE

RESULTS_FILE holds tab-separated `STATUS CHECK DETAIL` lines. PASS, WARN,
XFAIL (an allowed failure from expected-failures.txt) and XPASS (an allowed
failure that now passes) count as passed; FAIL as failed; SKIP as neither.
The last line printed is exactly `N passed, M failed`. Exit 1 when M > 0 or
nothing ran.
"""

from __future__ import annotations

import sys

PASSING = {"PASS", "WARN", "XFAIL", "XPASS"}


def main() -> int:
    rows = []
    with open(sys.argv[1]) as f:
        for raw in f:
            raw = raw.rstrip("\n")
            if raw:
                status, check, detail = (raw.split("\t", 2) + ["", ""])[:3]
                rows.append((status, check, detail))
    print("=" * 78)
    print("Summary (tests/clients)")
    print("=" * 78)
    for status, check, detail in rows:
        print(f"{status:<5} {check}")
        if detail and status != "PASS":
            print(f"      -> {detail}")
    passed = sum(s in PASSING for s, _, _ in rows)
    failed = sum(s == "FAIL" for s, _, _ in rows)
    skipped = sum(s == "SKIP" for s, _, _ in rows)
    unknown = [s for s, _, _ in rows if s not in PASSING | {"FAIL", "SKIP"}]
    failed += len(unknown)
    notes = []
    if n := sum(s == "XFAIL" for s, _, _ in rows):
        notes.append(f"{n} expected failure(s) from expected-failures.txt")
    if n := sum(s == "XPASS" for s, _, _ in rows):
        notes.append(f"WARNING: {n} expected failure(s) now pass; remove their lines from expected-failures.txt")
    if n := sum(s == "WARN" for s, _, _ in rows):
        notes.append(f"{n} check(s) passed with a warning")
    if skipped:
        notes.append(f"{skipped} skipped (not applicable)")
    print("-" * 78)
    for note in notes:
        print(note)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
