#!/usr/bin/env python3
"""Refused sends with and without idempotency keys, two builds alternated:
calls/s and CPU per call of PostgreSQL (the cluster's processes) and the
replica. Usage: bench/refused_keyed_cost.py DATABASE_URL (OLD and NEW below
are the two binaries; PGDIR the cluster's folder). A measurement helper,
not part of `make bench`."""
import http.client, json, os, subprocess, sys, threading, time, uuid
OLD, NEW = os.environ.get("OLD", "/tmp/attack2/phone"), os.environ.get("NEW", "target/release/phone")
URL = sys.argv[1]
PORT = 3401
PGDIR = os.environ.get("PGDIR", "/tmp/fix/pg")
def children_cpu(root):
    tot = 0
    tick = os.sysconf("SC_CLK_TCK")
    for p in os.listdir("/proc"):
        if not p.isdigit(): continue
        try:
            st = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except Exception: continue
        ppid = int(st[1])
        if int(p) == root or ppid == root:
            tot += int(st[11]) + int(st[12])
    return tot / tick
def pid_cpu(pid):
    st = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
class Conn:
    def __init__(self):
        self.c = http.client.HTTPConnection("127.0.0.1", PORT)
        self.n = 0
        self.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "m", "version": "0"}})
        self.rpc("notifications/initialized", None, notify=True)
    def rpc(self, method, params, token=None, notify=False):
        body = {"jsonrpc": "2.0", "method": method}
        if params is not None: body["params"] = params
        if not notify:
            self.n += 1; body["id"] = self.n
        h = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        if token: h["Authorization"] = "Bearer " + token
        self.c.request("POST", "/mcp", json.dumps(body), h)
        r = self.c.getresponse(); d = r.read().decode()
        if notify or not d: return None
        for line in d.splitlines():
            if line.startswith("data:"): return json.loads(line[5:])
        return json.loads(d)
    def call(self, tool, args, token=None):
        return self.rpc("tools/call", {"name": tool, "arguments": args}, token)["result"]
def start(binary):
    env = dict(os.environ, DATABASE_URL=URL, PORT=str(PORT), PHONE_BIND="127.0.0.1", RUST_LOG="warn",
               PHONE_REGISTER_LIMIT="0", PHONE_WORKER_THREADS="1")
    p = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL, stderr=open("/tmp/fix/server.log", "a"))
    for _ in range(200):
        try:
            c = http.client.HTTPConnection("127.0.0.1", PORT); c.request("GET", "/health"); 
            if c.getresponse().status == 200: return p
        except Exception: pass
        time.sleep(0.05)
    raise SystemExit("no server")
pm = int(open(f"{PGDIR}/postmaster.pid").readline())
p = start(OLD)
c = Conn()
s = c.call("phone_register", {"name": "s-" + uuid.uuid4().hex[:6], "description": "s", "project": "p"})["structuredContent"]
r = c.call("phone_register", {"name": "r-" + uuid.uuid4().hex[:6], "description": "r", "project": "p"})["structuredContent"]
c.call("phone_settings", {"contact_policy": "closed"}, r["token"])
p.terminate(); p.wait()
N, T = 1500, 8
def run(binary, keyed):
    p = start(binary)
    conns = [Conn() for _ in range(T)]
    # warm-up
    for cc in conns: cc.call("phone_send", {"to": r["name"], "body": "w", "idempotency_key": uuid.uuid4().hex}, s["token"])
    errs = [0]
    def work(cc, n):
        for _ in range(n):
            a = {"to": r["name"], "body": "hello"}
            if keyed: a["idempotency_key"] = uuid.uuid4().hex
            res = cc.call("phone_send", a, s["token"])
            if not res.get("isError"): errs[0] += 1
    pg0, sv0, t0 = children_cpu(pm), pid_cpu(p.pid), time.time()
    ts = [threading.Thread(target=work, args=(cc, N // T)) for cc in conns]
    [t.start() for t in ts]; [t.join() for t in ts]
    dt = time.time() - t0
    pg1, sv1 = children_cpu(pm), pid_cpu(p.pid)
    p.terminate(); p.wait()
    n = (N // T) * T
    return n / dt, (pg1 - pg0) / n * 1e6, (sv1 - sv0) / n * 1e6, errs[0]
for rnd in range(3):
    for name, b in (("old", OLD), ("new", NEW)):
        for keyed in (True, False):
            rate, pgus, svus, e = run(b, keyed)
            print(f"round {rnd} {name} keyed={keyed}: {rate:.0f} calls/s, PG {pgus:.0f} us/call, server {svus:.0f} us/call, not refused {e}", flush=True)
