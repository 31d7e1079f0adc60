#!/usr/bin/env python3
"""Drives `phone channel` as Claude Code does, over its stdin and stdout:
probes with server/discover (2026-07-28), initializes at 2025-11-25, then
waits for channel notifications. Exits 0 when it saw the backlog announced,
and a message sent meanwhile (by SEND_COMMAND) announced within a second.

    channel_check.py PHONE_BINARY SEND_COMMAND...

The environment (PHONE_URL / PHONE_TOKEN or XDG_CONFIG_HOME with a profile)
is the channel's. Prints one line per step; every stdout line of the
channel must be JSON-RPC.
"""
import json
import os
import subprocess
import sys
import threading
import time

phone, send = sys.argv[1], sys.argv[2:]
proc = subprocess.Popen([phone, "channel"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, env=os.environ.copy())
lines = []
stderr = []
threading.Thread(target=lambda: stderr.extend(l.decode() for l in proc.stderr), daemon=True).start()


def fail(why):
    print("FAIL " + why)
    print("  stderr: " + "".join(stderr)[-600:])
    proc.kill()
    sys.exit(1)


def write(message):
    proc.stdin.write((json.dumps(message) + "\n").encode())
    proc.stdin.flush()


def read(timeout):
    """The next stdout message within `timeout` seconds, or None."""
    box = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not box or not box[0]:
        return None
    line = box[0].decode()
    lines.append(line)
    try:
        message = json.loads(line)
    except ValueError:
        fail("stdout carried a line that is not JSON: %r" % line[:200])
    if message.get("jsonrpc") != "2.0":
        fail("stdout carried a line that is not JSON-RPC: %r" % line[:200])
    return message


meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "channel_check", "version": "0"}}
write({"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {"_meta": meta}})
probe = read(10) or fail("no answer to server/discover")
if "2026-07-28" in json.dumps(probe.get("result", {}).get("supportedVersions", [])):
    fail("the channel offers 2026-07-28, on which Claude Code skips channels: %s" % probe)
write({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "channel_check", "version": "0"}}})
init = read(10) or fail("no answer to initialize")
result = init.get("result") or fail("initialize failed: %s" % init)
if result.get("protocolVersion") != "2025-11-25":
    fail("negotiated %s" % result.get("protocolVersion"))
if "claude/channel" not in (result.get("capabilities", {}).get("experimental") or {}):
    fail("no claude/channel capability: %s" % result)
write({"jsonrpc": "2.0", "method": "notifications/initialized"})
print("PASS handshake: 2025-11-25, capability experimental.claude/channel")

backlog = read(10) or fail("the unread backlog was not announced")
if backlog.get("method") != "notifications/claude/channel":
    fail("unexpected message %s" % backlog)
print("PASS backlog announced: %s" % backlog["params"]["meta"].get("message_id"))

started = time.time()
subprocess.run(send, check=True, stdout=subprocess.DEVNULL)
note = read(5) or fail("a new message was not announced")
latency = time.time() - started
if note.get("method") != "notifications/claude/channel" or "phone_inbox" not in note["params"]["content"]:
    fail("unexpected notification %s" % note)
print("PASS new message announced in %.0f ms (send command included): %s" % (latency * 1000, note["params"]["content"][:160]))
if latency > 1.5:
    fail("too slow: %.2f s" % latency)
extra = read(1.5)
if extra is not None:
    fail("announced twice: %s" % extra)
proc.stdin.close()
proc.wait(timeout=10)
print("PASS exits %d when Claude Code closes stdin; %d stdout lines, all JSON-RPC" % (proc.returncode, len(lines)))
