"""The official Python MCP SDK (`mcp` from PyPI) against phone's /mcp.

One run = one variant: a protocol mode (`legacy` initialize handshake, `auto`
server/discover, or a pinned modern version such as `2026-07-28`) and an auth
style (`args`: name+token as tool arguments; `bearer`: an Authorization header
on the HTTP client). It walks the whole flow two agents go through —
register, search, send, inbox, reply — and asserts on structuredContent.

    python py_client.py URL MODE AUTH RUN_ID

Exit 0 when every assertion holds; otherwise the failing assertion is printed.
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

TOOLS = {"phone_register", "phone_search", "phone_send", "phone_inbox"}
HANDSHAKE_VERSIONS = {"2025-03-26", "2025-06-18", "2025-11-25"}


def log(msg: str) -> None:
    print(f"  {msg}", flush=True)


def check(cond: bool, what: str, got: Any = None) -> None:
    if not cond:
        raise AssertionError(f"{what}; got: {got!r}")


class Runner:
    def __init__(self, url: str, mode: str, auth: str, run_id: str) -> None:
        self.url, self.mode, self.auth = url, mode, auth
        variant = f"py-{mode.replace('-', '')}-{auth}"
        self.alice = f"{variant}-alice-{run_id}"
        self.bob = f"{variant}-bob-{run_id}"
        self.project = f"clients-{variant}-{run_id}"
        self.tokens: dict[str, str] = {}

    @asynccontextmanager
    async def client(self, bearer: str | None = None) -> AsyncIterator[Client]:
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        timeout = httpx2.Timeout(20.0)
        async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
            transport = streamable_http_client(self.url, http_client=http)
            async with Client(transport, mode=self.mode, read_timeout_seconds=20) as c:
                yield c

    async def call(self, c: Client, tool: str, args: dict[str, Any]) -> Any:
        """A call that must succeed; returns its structuredContent."""
        r = await c.call_tool(tool, args)
        text = " ".join(getattr(b, "text", "") for b in r.content)
        check(not r.is_error, f"{tool} returned isError", text)
        check(isinstance(r.structured_content, dict), f"{tool} has structuredContent", r.structured_content)
        check(bool(text.strip()), f"{tool} also has a text block", r.content)
        return r.structured_content

    async def call_err(self, c: Client, tool: str, args: dict[str, Any]) -> str:
        """A call that must fail as a tool result (isError true), not a protocol error."""
        r = await c.call_tool(tool, args)
        text = " ".join(getattr(b, "text", "") for b in r.content)
        check(r.is_error, f"{tool} should return isError true", r.structured_content)
        return text

    def auth_args(self, who: str) -> dict[str, Any]:
        return {"name": who, "token": self.tokens[who]} if self.auth == "args" else {}

    async def run(self) -> None:
        # Connect without credentials: protocol version, instructions, tools.
        async with self.client() as c:
            version = c.protocol_version
            if self.mode == "legacy":
                check(version in HANDSHAKE_VERSIONS, "legacy mode negotiates a handshake-era version", version)
            elif self.mode == "auto":
                check(version == "2026-07-28", "auto mode discovers 2026-07-28 on this server", version)
            else:
                check(version == self.mode, "pinned version is used", version)
            log(f"connected, protocol {version}")
            # A pinned client skips server/discover: no instructions or serverInfo to check.
            if self.mode in ("legacy", "auto"):
                instructions = c.instructions or ""
                check("phone_register" in instructions, "server instructions mention phone_register", instructions)
                info = c.server_info
                check(info is not None and info.name == "phone", "serverInfo.name is phone", info)

            listed = await c.list_tools()
            names = {t.name for t in listed.tools}
            check(TOOLS <= names, "tools/list has the four phone tools", sorted(names))
            for t in listed.tools:
                if t.name in TOOLS:
                    check(t.output_schema is not None, f"{t.name} declares an outputSchema", t)
            log(f"tools/list: {sorted(names)}")

            # Register two agents; each new name gets a token, shown once.
            for who, desc in (
                (self.alice, "Translates invoices between French and German"),
                (self.bob, "Answers questions about shipping schedules"),
            ):
                out = await self.call(c, "phone_register", {"name": who, "description": desc, "project": self.project})
                check(out.get("name") == who, "register echoes the name", out)
                check(out.get("description") == desc, "register echoes the description", out)
                check(out.get("project") == self.project, "register echoes the project", out)
                check(out.get("created") is True, "a new name is created", out)
                token = out.get("token")
                check(isinstance(token, str) and token.startswith("phn_"), "a new name gets a phn_ token", out)
                self.tokens[who] = token
            log(f"registered {self.alice}, {self.bob}")

            # Registering the same name again without its token is refused.
            err = await self.call_err(
                c, "phone_register", {"name": self.alice, "description": "impostor", "project": self.project}
            )
            log(f"re-register without token refused: {err[:80]!r}")

            # Search: by project, then by words within it.
            out = await self.call(c, "phone_search", {"project": self.project})
            found = {a["name"]: a for a in out.get("agents", [])}
            check(set(found) == {self.alice, self.bob}, "project search finds both agents", sorted(found))
            for a in found.values():
                check(a["project"] == self.project, "search result carries the project", a)
                check(bool(a.get("registered_at")), "search result has registered_at", a)
                check("last_seen_at" in a, "search result has last_seen_at", a)
            out = await self.call(c, "phone_search", {"query": "invoices", "project": self.project})
            names = [a["name"] for a in out.get("agents", [])]
            check(names == [self.alice], "word search finds only the invoice translator", names)
            check(
                out["agents"][0]["description"] == "Translates invoices between French and German",
                "search returns the description",
                out["agents"][0],
            )
            out = await self.call(c, "phone_search", {"project": self.project, "limit": 1})
            check(len(out["agents"]) == 1 and out.get("next_cursor"), "limit 1 gives one agent and a cursor", out)
            page2 = await self.call(c, "phone_search", {"project": self.project, "limit": 1, "cursor": out["next_cursor"]})
            check(
                len(page2["agents"]) == 1 and page2["agents"][0]["name"] != out["agents"][0]["name"],
                "the cursor gives the other agent",
                page2,
            )
            log("search: project, words, pagination ok")

            # Without credentials, send is a tool error (not a protocol error).
            if self.auth == "bearer":
                err = await self.call_err(c, "phone_send", {"to": self.bob, "body": "hi"})
                check("auth" in err.lower() or "token" in err.lower(), "unauthenticated send says why", err)
                log("send without credentials refused")

            # An unknown tool is a JSON-RPC error.
            try:
                r = await c.call_tool("phone_nonexistent", {})
            except MCPError as e:
                log(f"unknown tool -> JSON-RPC error {e.error.code}")
            else:
                raise AssertionError(f"unknown tool should be a JSON-RPC error; got result {r!r}")

        # The conversation, with each agent's own client (a bearer header in that mode).
        async with self.client(self.bearer(self.alice)) as ca, self.client(self.bearer(self.bob)) as cb:
            if self.auth == "args":
                # A wrong token with a valid shape is refused as a tool error.
                bogus = "phn_" + "A" * 43
                err = await self.call_err(
                    ca, "phone_send", {"name": self.alice, "token": bogus, "to": self.bob, "body": "x"}
                )
                log(f"wrong token refused: {err[:80]!r}")

            key = f"q-{self.alice}"
            question = {"to": self.bob, "subject": "Shipping", "body": "When does the Lyon shipment leave?\nThanks.", "idempotency_key": key}
            sent = await self.call(ca, "phone_send", {**self.auth_args(self.alice), **question})
            check(sent.get("to") == self.bob, "send echoes the recipient", sent)
            check(sent.get("replayed") is False, "a first send is not a replay", sent)
            for field in ("id", "thread_id", "sent_at"):
                check(isinstance(sent.get(field), str) and sent[field], f"send returns {field}", sent)
            again = await self.call(ca, "phone_send", {**self.auth_args(self.alice), **question})
            check(again.get("replayed") is True and again.get("id") == sent["id"], "same idempotency_key replays", again)
            log(f"sent {sent['id']} (thread {sent['thread_id']}); retry replayed")

            # Bob peeks, then reads.
            box = await self.call(cb, "phone_inbox", {**self.auth_args(self.bob), "peek": True})
            check([m["id"] for m in box["messages"]] == [sent["id"]], "peek shows exactly the one message", box)
            check(box["messages"][0].get("read_at") is None, "a peeked message stays unread", box["messages"][0])
            box = await self.call(cb, "phone_inbox", self.auth_args(self.bob))
            msgs = box.get("messages", [])
            check(len(msgs) == 1, "bob has one message (the replayed send was not delivered twice)", msgs)
            m = msgs[0]
            expect = {
                "id": sent["id"],
                "from": self.alice,
                "from_project": self.project,
                "to": self.bob,
                "subject": "Shipping",
                "body": "When does the Lyon shipment leave?\nThanks.",
                "reply_to": None,
                "thread_id": sent["thread_id"],
                "sent_at": m.get("sent_at"),
            }
            for k, v in expect.items():
                check(m.get(k) == v, f"inbox message field {k}", m)
            check(box.get("unread_remaining") == 0, "nothing else unread", box)
            box = await self.call(cb, "phone_inbox", self.auth_args(self.bob))
            check(box["messages"] == [], "a read message is not returned again as unread", box)
            hist = await self.call(cb, "phone_inbox", {**self.auth_args(self.bob), "include_read": True})
            read = [x for x in hist["messages"] if x["id"] == sent["id"]]
            check(len(read) == 1 and read[0].get("read_at"), "include_read shows it with read_at", hist)
            log("bob: peek, read, history ok")

            # Bob replies; `to` is implied by reply_to.
            reply = await self.call(
                cb, "phone_send", {**self.auth_args(self.bob), "reply_to": sent["id"], "body": "Tuesday 9:00."}
            )
            check(reply.get("to") == self.alice, "a reply goes to the original sender", reply)
            check(reply.get("thread_id") == sent["thread_id"], "a reply stays in the thread", reply)
            check(reply.get("id") != sent["id"], "a reply is a new message", reply)

            box = await self.call(ca, "phone_inbox", self.auth_args(self.alice))
            msgs = box.get("messages", [])
            check(len(msgs) == 1, "alice has the reply", msgs)
            r = msgs[0]
            check(r.get("id") == reply["id"], "the reply's id", r)
            check(r.get("reply_to") == sent["id"], "the reply links to the question", r)
            check(r.get("thread_id") == sent["thread_id"], "the reply carries the thread id", r)
            check(r.get("from") == self.bob and r.get("to") == self.alice, "the reply's from/to", r)
            check(r.get("from_project") == self.project, "the reply's from_project", r)
            check(r.get("body") == "Tuesday 9:00.", "the reply's body", r)
            log(f"alice got reply {reply['id']} -> reply_to {sent['id']}, same thread")

            # Activity shows in the directory.
            out = await self.call(ca, "phone_search", {"project": self.project})
            seen = {a["name"]: a.get("last_seen_at") for a in out["agents"]}
            check(all(seen.values()), "both agents have last_seen_at after using their tokens", seen)

    def bearer(self, who: str) -> str | None:
        return self.tokens[who] if self.auth == "bearer" else None


def innermost(e: BaseException) -> BaseException:
    """The first leaf of an ExceptionGroup (anyio wraps failures in task groups)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


async def main() -> int:
    url, mode, auth, run_id = sys.argv[1:5]
    try:
        await asyncio.wait_for(Runner(url, mode, auth, run_id).run(), timeout=90)
    except BaseException as e:  # noqa: BLE001 - report anything, including ExceptionGroups
        leaf = innermost(e)
        print(f"FAIL python mode={mode} auth={auth}: {type(leaf).__name__}: {leaf}", flush=True)
        traceback.print_exc(limit=6)
        return 1
    print(f"ok python mode={mode} auth={auth}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
