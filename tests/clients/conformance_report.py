"""Turns one conformance scenario's checks.json into result lines.

    python3 conformance_report.py SUITE SCENARIO OUT_DIR EXPECTED_FILE RESULTS_FILE

SUITE is the package spec, e.g. conformance@0.1.16. Every check id of the
scenario becomes one result (ids the suite repeats for several probes are
merged: any failing probe fails the id). A failing check passes only when
EXPECTED_FILE lists `SUITE SCENARIO CHECK_ID REASON`; a listed check that now
succeeds is reported as XPASS so the line can be removed.

Result lines (tab-separated, appended to RESULTS_FILE):
    STATUS  CHECK  DETAIL      with STATUS in PASS FAIL XFAIL XPASS WARN SKIP
Stdlib only. Exit 0 always; the summary decides.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load_expected(path: Path) -> dict[tuple[str, str, str], str]:
    expected: dict[tuple[str, str, str], str] = {}
    if not path.exists():
        return expected
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 3)
        if len(parts) < 4 or not parts[3].strip():
            sys.exit(f"{path}:{n}: expected 'SUITE SCENARIO CHECK_ID REASON', got: {raw!r}")
        expected[(parts[0], parts[1], parts[2])] = parts[3].strip()
    return expected


def one_line(text: object, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def main() -> None:
    suite, scenario, out_dir, expected_file, results_file = sys.argv[1:6]
    expected = load_expected(Path(expected_file))
    label = f"{suite} {scenario}"
    found = sorted(Path(out_dir).rglob("checks.json"))
    lines: list[str] = []
    if not found:
        lines.append(f"FAIL\t{label}\tno checks.json under {out_dir}: the suite did not finish (see its log)")
    else:
        checks = json.loads(found[-1].read_text())
        merged: dict[str, list[dict]] = {}
        for c in checks:
            merged.setdefault(c["id"], []).append(c)
        if not merged:
            lines.append(f"FAIL\t{label}\tchecks.json holds no checks")
        for cid, probes in merged.items():
            statuses = [p.get("status", "?") for p in probes]
            failing = [p for p in probes if p.get("status") == "FAILURE"]
            name = f"{label} {cid}" + (f" ({len(probes)} probes)" if len(probes) > 1 else "")
            reason = expected.pop((suite, scenario, cid), None)
            if failing:
                first = failing[0]
                detail = one_line(first.get("errorMessage") or first.get("description", ""))
                if details := first.get("details"):
                    detail += " | details: " + one_line(json.dumps(details), 400)
                if reason:
                    lines.append(f"XFAIL\t{name}\texpected failure: {reason}")
                else:
                    lines.append(f"FAIL\t{name}\t{detail}")
            elif reason:
                lines.append(f"XPASS\t{name}\tlisted in expected-failures.txt but now {statuses[0]}: remove the line")
            elif "WARNING" in statuses:
                w = next(p for p in probes if p.get("status") == "WARNING")
                lines.append(f"WARN\t{name}\t{one_line(w.get('errorMessage') or w.get('description', ''))}")
            elif all(s in ("SKIPPED", "INFO") for s in statuses):
                lines.append(f"SKIP\t{name}\t{one_line((probes[0].get('details') or {}).get('note', statuses[0]))}")
            else:
                lines.append(f"PASS\t{name}\t")
    # Listed checks the suite did not report at all are stale lines, too.
    for (s, sc, cid), reason in expected.items():
        if s == suite and sc == scenario and found:
            lines.append(f"XPASS\t{label} {cid}\tlisted in expected-failures.txt but not reported by the suite: remove the line")
    with open(results_file, "a") as f:
        for line in lines:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
