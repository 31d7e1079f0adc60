"""The MCP Inspector CLI (@modelcontextprotocol/inspector) against phone's /mcp.

    python3 inspector_check.py INSPECTOR_BIN URL RUN_ID RESULTS_FILE

INSPECTOR_BIN is node_modules/.bin/mcp-inspector (what `npx
@modelcontextprotocol/inspector` runs); Node 22 must be first on PATH. Runs
tools/list in the legacy (initialize) and modern (2026-07-28) protocol eras,
then tools/call: register two agents with --tool-arg, send and read a message
with `--header "Authorization: Bearer ..."`, and a wrong bearer token, which
the server refuses at the handshake (HTTP 401 with WWW-Authenticate: Bearer),
so the CLI reports that authorization is required instead of connecting.
Appends one result line per check. Stdlib only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

TOOLS = {"phone_register", "phone_search", "phone_send", "phone_inbox"}


class Inspector:
    def __init__(self, bin_path: str, url: str) -> None:
        self.bin, self.url = bin_path, url

    def run(self, *args: str, era: str = "legacy") -> tuple[int, Any, str]:
        cmd = [self.bin, "--cli", self.url, "--transport", "http", "--protocol-era", era,
               "--connect-timeout", "15000", "--format", "json", *args]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return -1, None, "timed out after 60 s"
        try:
            out = json.loads(p.stdout) if p.stdout.strip() else None
        except json.JSONDecodeError:
            out = None
        stderr = p.stderr.strip()
        if out is None:
            stderr = f"stdout: {p.stdout.strip()[:300]} | stderr: {stderr[:500]}"
        return p.returncode, out, stderr

    def call(self, tool: str, *args: str, bearer: str | None = None, era: str = "legacy") -> tuple[int, Any, str]:
        extra = ["--header", f"Authorization: Bearer {bearer}"] if bearer else []
        return self.run("--method", "tools/call", "--tool-name", tool, *extra, *args, era=era)


def main() -> int:
    bin_path, url, run_id, results_file = sys.argv[1:5]
    insp = Inspector(bin_path, url)
    results: list[tuple[str, str, str]] = []

    def record(name: str, ok: bool, detail: str = "", warning: str = "") -> bool:
        status = "FAIL" if not ok else "WARN" if warning else "PASS"
        note = detail if not ok else warning
        results.append((status, f"inspector {name}", " ".join(note.split())[:600]))
        print(f"  {status:<4} inspector {name} {note[:600]}", flush=True)
        return ok

    # tools/list, both protocol eras; --strict turns schema portability errors into exit 6.
    for era in ("legacy", "modern"):
        rc, out, err = insp.run("--method", "tools/list", "--strict", era=era)
        tools = {t.get("name"): t for t in ((out or {}).get("result") or {}).get("tools", [])}
        problem = ""
        if rc != 0:
            problem = f"exit {rc}: {err}"
        elif not TOOLS <= set(tools):
            problem = f"tools missing: {sorted(TOOLS - set(tools))}; got {sorted(tools)}"
        else:
            for name in TOOLS:
                t = tools[name]
                if (t.get("inputSchema") or {}).get("type") != "object" or not t.get("outputSchema"):
                    problem = f"{name} lacks an object inputSchema or an outputSchema: {json.dumps(t)[:300]}"
        # Portability warnings (e.g. `"type": ["string", "null"]`, which some model
        # providers' schema dialects refuse) fail the check: there must be none.
        warned = sorted({line.split('"')[1] for line in err.splitlines() if line.startswith("Warning: tool")})
        warning = ""
        if warned:
            paths = [ln.strip()[len("Path: "):] for ln in err.splitlines() if ln.strip().startswith("Path: ")]
            issues = [ln.strip()[len("Issue: "):] for ln in err.splitlines() if ln.strip().startswith("Issue: ")]
            first = issues[0].split(". ")[0] if issues else "?"
            warning = (f"{len(paths)} schema portability warning(s) in {', '.join(warned)}; "
                       f"first: {paths[0] if paths else '?'}: {first}")
            print(f"  inspector --strict said ({era}):\n{err}", flush=True)
            problem = problem or warning
        record(f"tools/list --protocol-era {era} --strict", not problem, problem)

    # tools/call: two agents registered with --tool-arg.
    alice, bob = f"insp-alice-{run_id}", f"insp-bob-{run_id}"
    project = f"clients-insp-{run_id}"
    tokens: dict[str, str] = {}
    for who in (alice, bob):
        rc, out, err = insp.call(
            "phone_register", "--tool-arg", f"name={who}", "description=Inspector CLI test agent", f"project={project}"
        )
        sc = ((out or {}).get("result") or {}).get("structuredContent") or {}
        ok = rc == 0 and sc.get("created") is True and sc.get("name") == who and str(sc.get("token", "")).startswith("phn_")
        record(f"tools/call phone_register {who.split('-')[1]}", ok, f"exit {rc}: {json.dumps(out)[:300]} {err}")
        if ok:
            tokens[who] = sc["token"]
    if len(tokens) < 2:
        record("tools/call with bearer header", False, "skipped: registration failed")
    else:
        body = f"hello from the inspector {run_id}"
        rc, out, err = insp.call(
            "phone_send", "--tool-arg", f"to={bob}", f"body={body}", "subject=inspector", bearer=tokens[alice]
        )
        sent = ((out or {}).get("result") or {}).get("structuredContent") or {}
        ok = rc == 0 and sent.get("to") == bob and sent.get("replayed") is False and sent.get("id")
        record("tools/call phone_send --header Authorization: Bearer", ok, f"exit {rc}: {json.dumps(out)[:300]} {err}")

        rc, out, err = insp.call("phone_inbox", bearer=tokens[bob], era="modern")
        box = ((out or {}).get("result") or {}).get("structuredContent") or {}
        msgs = box.get("messages") or []
        ok = (
            rc == 0
            and len(msgs) == 1
            and msgs[0].get("id") == sent.get("id")
            and msgs[0].get("from") == alice
            and msgs[0].get("to") == bob
            and msgs[0].get("body") == body
            and msgs[0].get("thread_id") == sent.get("thread_id")
        )
        record(
            "tools/call phone_inbox --header Authorization: Bearer (modern era)",
            ok,
            f"exit {rc}: {json.dumps(out)[:400]} {err}",
        )

        # A well-formed but unknown token: refused at the handshake (401), so the
        # CLI does not connect; it reports that authorization is required.
        rc, out, err = insp.call("phone_inbox", bearer="phn_" + "C" * 43)
        ok = rc != 0 and out is None and "auth_required" in err
        record("tools/call with a wrong bearer token is refused at the handshake (401)", ok, f"exit {rc}: {json.dumps(out)[:300]} {err}")

    with open(results_file, "a") as f:
        for status, name, detail in results:
            f.write(f"{status}\t{name}\t{detail}\n")
    return 0 if all(s != "FAIL" for s, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
