// Writes a dsh session with the real library (tests/daemon/test_dsh_e2e.py, issue #27): its own
// SessionStore and JsonlSessionPersistence, events made by its own message constructors.
//
//   node driver.mjs ROOT CWD SESSION_ID zstd|none
//
// DSH_MODULES names the node_modules the packages are in (tests/support/dsh/install.sh puts
// them in .cache/dsh). Commands, one per stdin line; each answers one stdout line once the
// library has flushed (written and fsynced) what it appended: "ok SEQ" or "error TEXT".
//   open            create the session, or load it if it exists (the library's crash repair)
//   turn [BYTES]    a whole turn: a step with streamed chunks, a tool call and its result
//   start [BYTES]   a turn up to a tool call that is still running (mid-tool-call)
//   finish          that tool's result, the step's and the turn's end
//   big BYTES       start a turn and append BYTES of chunks without waiting (for a kill -9)
//   quit
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { createInterface } from 'node:readline';
import { randomBytes } from 'node:crypto';

const modules = process.env.DSH_MODULES ?? new URL('./node_modules/', import.meta.url).pathname;
const req = createRequire(modules.replace(/\/?$/, '/') + 'driver.js');
const load = async (name) => import(pathToFileURL(req.resolve(name)).href);
const { Context } = await load('@deepseek-ai/cordis');
const { SessionStore, SessionId } = await load('@deepseek-ai/dsh-session');
const { JsonlSessionPersistence } = await load('@deepseek-ai/dsh-session-persistence-jsonl');
const { CallId, createUserMessage, createAssistantMessage, createToolResultMessage } =
  await load('@deepseek-ai/dsh-llm');

const [root, cwd, id, compression] = process.argv.slice(2);
const ctx = new Context();
ctx.plugin(SessionStore);
ctx.plugin(JsonlSessionPersistence, { root, compression });
while (ctx.sessions === undefined || ctx.sessionPersistence === undefined) {
  await new Promise((r) => setTimeout(r, 5));
}

let session;
let turn = 0;
let open = null; // {turn, step, callId} of a tool call still running

function text(bytes) {
  // Incompressible, so that a big batch is a big write (a kill -9 can land inside it).
  return randomBytes(Math.ceil(Math.max(1, Number(bytes) || 64) / 2)).toString('hex');
}

function upToCall(bytes) {
  turn += 1;
  const s = session;
  s.append('turn/start', { turn });
  s.append('user/message', createUserMessage({
    content: [{ type: 'text', text: `prompt ${turn}` }], source: { kind: 'user' },
  }), { surfaceOp: 'append' });
  s.append('step/start', { turn, step: 1 });
  const body = text(bytes);
  for (let i = 0; i < body.length; i += 4096) {
    s.append('assistant/chunk', { turn, step: 1,
      chunk: { type: 'text-delta', index: 0, text: body.slice(i, i + 4096) } });
  }
  const callId = CallId(`call-${turn}`);
  s.append('assistant/message', { turn, step: 1, message: createAssistantMessage({
    content: [{ type: 'text', text: 'running a tool' },
      { type: 'tool-call', id: callId, name: 'bash', arguments: '{"cmd":"ls"}' }],
    source: { provider: 'test', model: 'test-model' },
  }) }, { surfaceOp: 'append' });
  s.append('tool/call', { turn, step: 1, callId, name: 'bash', arguments: '{"cmd":"ls"}' });
  open = { turn, step: 1, callId };
}

function finish() {
  const { turn: t, step, callId } = open;
  session.append('tool/result', { turn: t, step, message: createToolResultMessage({
    callId, content: [{ type: 'text', text: 'a b c' }], isError: false,
  }) }, { surfaceOp: 'append' });
  session.append('step/end', { turn: t, step });
  session.append('turn/end', { turn: t, reason: { kind: 'completed' } });
  open = null;
}

async function openSession() {
  const sid = SessionId(id);
  const stored = (await ctx.sessionPersistence.list()).find((m) => m.id === sid);
  if (stored === undefined) {
    session = ctx.sessions.create(sid, { meta: { cwd } });
    return;
  }
  const { meta, events } = await ctx.sessionPersistence.load(sid); // repairs a crashed tail
  session = ctx.sessions.create(sid, { seed: events, meta });
  for (const e of events) if (e.type === 'turn/start') turn = Math.max(turn, e.data.turn);
}

const rl = createInterface({ input: process.stdin });
for await (const line of rl) {
  const [cmd, arg] = line.trim().split(/\s+/);
  try {
    if (cmd === 'open') await openSession();
    else if (cmd === 'turn') { upToCall(arg); finish(); }
    else if (cmd === 'start') upToCall(arg);
    else if (cmd === 'finish') finish();
    else if (cmd === 'big') { upToCall(arg); console.log('writing'); continue; }
    else if (cmd === 'quit') break;
    else throw new Error(`unknown command ${cmd}`);
    await ctx.sessions.flush(session);
    console.log(`ok ${session.seq}`);
  } catch (e) {
    console.log(`error ${String(e?.message ?? e).replace(/\n/g, ' ')}`);
  }
}
process.exit(0);
