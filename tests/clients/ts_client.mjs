// The official TypeScript MCP SDK (@modelcontextprotocol/sdk, v1) against
// phone's /mcp, through StreamableHTTPClientTransport. The same flow as
// py_client.py: register, search, send, inbox, reply; asserts on
// structuredContent. The SDK also validates every structuredContent against
// the tool's outputSchema from tools/list.
//
//   PHONE_CLIENTS_NODE_MODULES=/cache/npm/node_modules node ts_client.mjs URL AUTH RUN_ID
//
// AUTH is `args` (name+token as tool arguments) or `bearer` (Authorization
// header through requestInit.headers). Exit 0 when every assertion holds.

import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const modules = process.env.PHONE_CLIENTS_NODE_MODULES;
if (!modules) throw new Error('PHONE_CLIENTS_NODE_MODULES is not set');
const require = createRequire(path.join(modules, 'noop.js'));
const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = require('@modelcontextprotocol/sdk/client/streamableHttp.js');
const { McpError } = require('@modelcontextprotocol/sdk/types.js');
const sdkVersion = JSON.parse(readFileSync(path.join(modules, '@modelcontextprotocol/sdk/package.json'), 'utf8')).version;

const [url, auth, runId] = process.argv.slice(2);
const TOOLS = ['phone_register', 'phone_search', 'phone_send', 'phone_inbox'];
const variant = `ts-${auth}`;
const alice = `${variant}-alice-${runId}`;
const bob = `${variant}-bob-${runId}`;
const project = `clients-${variant}-${runId}`;
const tokens = {};
const open = [];

const log = (msg) => console.log(`  ${msg}`);
function check(cond, what, got) {
  if (!cond) throw new Error(`${what}; got: ${JSON.stringify(got)}`);
}
const textOf = (r) => (r.content || []).map((b) => b.text || '').join(' ');

async function connect(bearer) {
  const headers = bearer ? { Authorization: `Bearer ${bearer}` } : {};
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
  const client = new Client({ name: 'phone-clients-ts', version: '0' });
  await client.connect(transport, { timeout: 20000 });
  open.push(client);
  // Output-schema validation needs the tool list cached in the client.
  await client.listTools();
  return client;
}

async function ok(c, name, args) {
  const r = await c.callTool({ name, arguments: args }, undefined, { timeout: 20000 });
  check(!r.isError, `${name} returned isError`, textOf(r));
  check(r.structuredContent && typeof r.structuredContent === 'object', `${name} has structuredContent`, r);
  check(textOf(r).trim().length > 0, `${name} also has a text block`, r.content);
  return r.structuredContent;
}

async function toolErr(c, name, args) {
  const r = await c.callTool({ name, arguments: args }, undefined, { timeout: 20000 });
  check(r.isError === true, `${name} should return isError true`, r);
  return textOf(r);
}

const authArgs = (who) => (auth === 'args' ? { name: who, token: tokens[who] } : {});
const bearerOf = (who) => (auth === 'bearer' ? tokens[who] : undefined);

async function run() {
  const c = await connect();
  const version = c.getNegotiatedProtocolVersion?.() ?? c.transport?.protocolVersion;
  log(`connected with @modelcontextprotocol/sdk ${sdkVersion}, protocol ${version}`);
  check(c.getServerVersion()?.name === 'phone', 'serverInfo.name is phone', c.getServerVersion());
  check((c.getInstructions() || '').includes('phone_register'), 'instructions mention phone_register', c.getInstructions());
  check(c.getServerCapabilities()?.tools, 'server declares the tools capability', c.getServerCapabilities());

  const listed = await c.listTools();
  const names = listed.tools.map((t) => t.name);
  check(TOOLS.every((t) => names.includes(t)), 'tools/list has the four phone tools', names);
  for (const t of listed.tools.filter((t) => TOOLS.includes(t.name))) {
    check(t.outputSchema && t.inputSchema?.type === 'object', `${t.name} has input and output schemas`, t);
  }
  log(`tools/list: ${names.join(', ')}`);

  for (const [who, description] of [
    [alice, 'Translates invoices between French and German'],
    [bob, 'Answers questions about shipping schedules'],
  ]) {
    const out = await ok(c, 'phone_register', { name: who, description, project });
    check(out.name === who && out.project === project && out.description === description, 'register echoes its input', out);
    check(out.created === true, 'a new name is created', out);
    check(typeof out.token === 'string' && out.token.startsWith('phn_'), 'a new name gets a phn_ token', out);
    tokens[who] = out.token;
  }
  log(`registered ${alice}, ${bob}`);

  let out = await ok(c, 'phone_search', { project });
  check(
    JSON.stringify(out.agents.map((a) => a.name).sort()) === JSON.stringify([alice, bob].sort()),
    'project search finds both agents',
    out,
  );
  out = await ok(c, 'phone_search', { query: 'invoices', project });
  check(out.agents.length === 1 && out.agents[0].name === alice, 'word search finds only the invoice translator', out);
  check(out.agents[0].project === project && out.agents[0].registered_at, 'search card has project and registered_at', out);
  log('search ok');

  try {
    const r = await c.callTool({ name: 'phone_nonexistent', arguments: {} });
    throw new Error(`unknown tool should be a JSON-RPC error; got ${JSON.stringify(r)}`);
  } catch (e) {
    check(e instanceof McpError, 'unknown tool raises McpError', String(e));
    log(`unknown tool -> JSON-RPC error ${e.code}`);
  }
  if (auth === 'bearer') {
    const err = await toolErr(c, 'phone_send', { to: bob, body: 'hi' });
    check(/auth|token/i.test(err), 'unauthenticated send says why', err);
    log('send without credentials refused');
  }

  const ca = await connect(bearerOf(alice));
  const cb = await connect(bearerOf(bob));
  if (auth === 'args') {
    const err = await toolErr(ca, 'phone_send', { name: alice, token: 'phn_' + 'B'.repeat(43), to: bob, body: 'x' });
    log(`wrong token refused: ${JSON.stringify(err.slice(0, 80))}`);
  }

  const question = { to: bob, subject: 'Shipping', body: 'When does the Lyon shipment leave?', idempotency_key: `q-${alice}` };
  const sent = await ok(ca, 'phone_send', { ...authArgs(alice), ...question });
  check(sent.to === bob && sent.replayed === false && sent.id && sent.thread_id && sent.sent_at, 'send result', sent);
  const again = await ok(ca, 'phone_send', { ...authArgs(alice), ...question });
  check(again.replayed === true && again.id === sent.id, 'same idempotency_key replays', again);
  log(`sent ${sent.id} (thread ${sent.thread_id}); retry replayed`);

  let box = await ok(cb, 'phone_inbox', authArgs(bob));
  check(box.messages.length === 1, 'bob has exactly one message', box);
  const m = box.messages[0];
  const expect = {
    id: sent.id, from: alice, from_project: project, to: bob, subject: 'Shipping',
    // A field that says nothing is left out: no reply_to on a first message.
    body: 'When does the Lyon shipment leave?', reply_to: undefined, thread_id: sent.thread_id,
  };
  for (const [k, v] of Object.entries(expect)) check(m[k] === v, `inbox message field ${k}`, m);
  check(typeof m.sent_at === 'string' && box.unread_remaining === 0, 'sent_at and unread_remaining', box);
  log('bob read the question');

  const reply = await ok(cb, 'phone_send', { ...authArgs(bob), reply_to: sent.id, body: 'Tuesday 9:00.' });
  check(reply.to === alice && reply.thread_id === sent.thread_id && reply.id !== sent.id, 'reply result', reply);
  box = await ok(ca, 'phone_inbox', authArgs(alice));
  check(box.messages.length === 1, 'alice has the reply', box);
  const r = box.messages[0];
  check(r.id === reply.id && r.reply_to === sent.id && r.thread_id === sent.thread_id, 'reply links to the question', r);
  check(r.from === bob && r.to === alice && r.body === 'Tuesday 9:00.', 'reply from/to/body', r);
  log(`alice got reply ${reply.id} -> reply_to ${sent.id}, same thread`);
}

const timer = setTimeout(() => {
  console.log(`FAIL typescript auth=${auth}: timed out after 90 s`);
  process.exit(1);
}, 90000);

try {
  await run();
  console.log(`ok typescript auth=${auth}`);
  process.exitCode = 0;
} catch (e) {
  console.log(`FAIL typescript auth=${auth}: ${e?.stack || e}`);
  process.exitCode = 1;
} finally {
  clearTimeout(timer);
  await Promise.allSettled(open.map((c) => c.close()));
}
