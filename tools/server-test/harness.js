// What the npm client tests (tools/server-test/*_client.js) share: "ok   NAME"
// / "FAIL NAME" lines, a fetch that records every exchange (a failure prints
// the request bodies the client sent and the answers it got, so a refusal or
// a mishandled field is seen exactly), the shared zod schemas (bounded: a
// random-weight model completes them) and the exit status.
'use strict';
const { z } = require('zod');

function harness(label) {
  let fails = 0;
  let exchanges = [];
  const cut = (s) => (s.length > 1500 ? `${s.slice(0, 1500)}...` : s);
  // A fetch for the client's options: the global one, each request and
  // answer (streams left alone) kept until the next check starts.
  const recordingFetch = async (input, init = {}) => {
    const url = typeof input === 'string' ? input : input.url || String(input);
    const entry = { method: init.method || 'GET', url, request: typeof init.body === 'string' ? init.body : '' };
    exchanges.push(entry);
    const res = await fetch(input, init);
    entry.status = res.status;
    if (!(res.headers.get('content-type') || '').includes('text/event-stream')) {
      entry.response = await res.clone().text();
    } else {
      entry.response = '(a stream)';
    }
    return res;
  };
  const ok = (name) => console.log(`ok   ${label}: ${name}`);
  const bad = (name, why) => {
    console.log(`FAIL ${label}: ${name}: ${why}`);
    for (const e of exchanges) {
      console.log(`     ${e.method} ${e.url} -> ${e.status}\n     request:  ${cut(e.request)}\n     response: ${cut(e.response || '')}`);
    }
    fails++;
  };
  async function check(name, fn) {
    exchanges = [];
    try { await fn(); ok(name); } catch (e) { bad(name, e && e.stack ? e.stack : e); }
  }
  function expect(cond, what) { if (!cond) throw new Error(what); }
  function run(main) {
    main().then(() => process.exit(fails ? 1 : 0), (e) => { console.log(`FAIL ${label}: ${e && e.stack ? e.stack : e}`); process.exit(1); });
  }
  // The request bodies and URLs sent since the check began.
  const sentBodies = () => exchanges.map((e) => e.request);
  const sentUrls = () => exchanges.map((e) => e.url);
  return { check, expect, run, fetch: recordingFetch, sentBodies, sentUrls };
}

// A light's settings (a tool's arguments) and a small record (structured
// output): booleans, enums, bounded integers and strings.
const lightArgs = z.object({ on: z.boolean(), color: z.enum(['red', 'green']) });
const record = z.object({
  name: z.string().max(8),
  count: z.number().int(),
  ok: z.boolean(),
  color: z.enum(['red', 'green', 'blue']),
});

module.exports = { harness, lightArgs, record, z };
