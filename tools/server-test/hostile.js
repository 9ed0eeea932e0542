// A hostile client against a running dpl-server (issue 28), and well-behaved
// streams running through the abuse. Raw sockets, Node's standard library
// only. The server must have been started as tests/server_hostile_test.sh
// does (-np 2 --queue 1, --header-timeout 2, --body-timeout 2,
// --max-connections 700, an API key), on the CPU device and a model with a
// vocabulary.
//
//   node hostile.js HOST PORT API_KEY SERVER_PID [CASE...]
//
// Prints "ok   NAME" / "FAIL NAME: why" lines and a "measured:" line per
// number docs/PERF.md records; exits 1 on any failure. It ends by sending
// the server SIGTERM with slow clients connected and timing its exit (the
// caller checks the exit status). CASE names run only those groups (headers,
// slowloris, body, memory, protocol, cancel, shutdown).
'use strict';
const net = require('net');
const fs = require('fs');
const zlib = require('zlib');

const [host, portText, key, pidText, ...only] = process.argv.slice(2);
const port = Number(portText);
const pid = Number(pidText);
let fails = 0;
const tStart = Date.now();
const ok = (name) => console.log(`ok   ${name} (${Date.now() - tStart} ms)`);
const bad = (name, why) => { console.log(`FAIL ${name}: ${why}`); fails++; };
const measured = (what) => console.log(`measured: ${what}`);
const check = (cond, name, why) => (cond ? ok(name) : bad(name, why));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const auth = `Authorization: Bearer ${key}\r\n`;

// Resident memory of the server, MiB.
function rssMiB() {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
  return m ? Number(m[1]) / 1024 : NaN;
}
let peakRss = 0;
const rssSampler = setInterval(() => { try { peakRss = Math.max(peakRss, rssMiB()); } catch (e) {} }, 20);

// Opens a connection, writes `chunks` (strings or Buffers, `gapMs` apart),
// and collects what comes back until the server closes or `waitMs` passes.
function exchange(chunks, { waitMs = 5000, gapMs = 0, endAfter = false, until = null } = {}) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const s = net.connect(port, host);
    const got = [];
    let done = false, closedByServer = false, error = null;
    const finish = () => {
      if (done) return;
      done = true;
      s.destroy();
      resolve({ data: Buffer.concat(got), closedByServer, error, ms: Date.now() - t0 });
    };
    s.on('data', (d) => {
      got.push(d);
      if (until && until(Buffer.concat(got))) finish();
    });
    s.on('error', (e) => { error = e.code; });
    s.on('close', () => { closedByServer = true; finish(); });
    s.on('connect', async () => {
      for (const c of chunks) {
        if (done || s.destroyed) break;
        s.write(c);
        if (gapMs) await sleep(gapMs);
      }
      if (endAfter && !s.destroyed) s.end();
    });
    setTimeout(finish, waitMs);
  });
}

// The responses in `data`: [{status, headers, body}], bodies by
// Content-Length or chunked, or to the end.
function parseResponses(data) {
  const out = [];
  let at = 0;
  const text = data.toString('latin1');
  while (at < text.length) {
    const end = text.indexOf('\r\n\r\n', at);
    if (end < 0) break;
    const lines = text.slice(at, end).split('\r\n');
    const status = Number(lines[0].split(' ')[1]);
    const headers = {};
    for (const l of lines.slice(1)) {
      const i = l.indexOf(':');
      headers[l.slice(0, i).toLowerCase()] = l.slice(i + 1).trim();
    }
    at = end + 4;
    if (status === 100) { out.push({ status, headers, body: '', complete: true }); continue; }
    let body = '', complete = false;
    if (headers['content-length'] !== undefined) {
      body = text.slice(at, at + Number(headers['content-length']));
      at += body.length;
      complete = body.length === Number(headers['content-length']);
    } else if ((headers['transfer-encoding'] || '').includes('chunked')) {
      for (;;) {
        const eol = text.indexOf('\r\n', at);
        if (eol < 0) { at = text.length; break; }
        const n = parseInt(text.slice(at, eol), 16);
        at = eol + 2;
        if (n === 0 && text.startsWith('\r\n', at)) { at += 2; complete = true; break; }
        if (!(n > 0) || at + n + 2 > text.length) { at = text.length; break; }
        body += text.slice(at, at + n);
        at += n + 2;
      }
    } else {
      body = text.slice(at);
      at = text.length;
    }
    out.push({ status, headers, body: Buffer.from(body, 'latin1').toString('utf8'), complete });
  }
  return out;
}

function request(method, path, body, extra = '') {
  const b = body === undefined ? '' : body;
  const len = body === undefined ? '' : `Content-Length: ${Buffer.byteLength(b)}\r\n`;
  return `${method} ${path} HTTP/1.1\r\nHost: x\r\n${auth}${len}${extra}\r\n${b}`;
}

// Whether `data` holds `n` complete responses (besides 100 Continue).
const responded = (n) => (data) => parseResponses(data).filter((x) => x.status !== 100 && x.complete).length >= n;

// One request on its own connection, until its response is complete (or the
// connection closes, or waitMs): {status, body, json, ms, closedByServer}.
async function call(raw, opts = {}) {
  const r = await exchange(Array.isArray(raw) ? raw : [raw], { until: responded(opts.responses || 1), ...opts });
  const [res] = parseResponses(r.data);
  let json = null;
  try { json = res ? JSON.parse(res.body) : null; } catch (e) {}
  return { status: res ? res.status : 0, headers: res ? res.headers : {}, body: res ? res.body : '', json, ms: r.ms,
           closedByServer: r.closedByServer, all: parseResponses(r.data), raw: r.data };
}

// An OpenAI error body naming `pattern`.
function isError(r, status, pattern) {
  return r.status === status && r.json && r.json.error && r.json.error.code === status &&
         typeof r.json.error.type === 'string' && new RegExp(pattern, 'i').test(r.json.error.message);
}
const show = (r) => `${r.status} ${r.body.slice(0, 200)}`;

async function healthMs() {
  const r = await call(`GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`, { waitMs: 10000 });
  return r.status === 200 ? r.ms : Infinity;
}

async function metric(name) {
  const r = await call(request('GET', '/metrics', undefined, 'Connection: close\r\n'));
  const m = r.body.match(new RegExp(`^dpl_${name} (\\S+)`, 'm'));
  return m ? Number(m[1]) : NaN;
}

async function waitFor(fn, ms) {
  const t0 = Date.now();
  while (Date.now() - t0 < ms) {
    if (await fn()) return true;
    await sleep(50);
  }
  return false;
}

// A well-behaved streaming client: a completion of `tokens` tokens; resolves
// with the tokens the usage chunk reports (-1 when the stream broke).
function wellBehavedStream(tokens) {
  const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: tokens, ignore_eos: true, stream: true,
                                stream_options: { include_usage: true } });
  return exchange([request('POST', '/v1/completions', body, 'Connection: close\r\n')], { waitMs: 120000 })
    .then((r) => {
      const [res] = parseResponses(r.data);
      if (!res || res.status !== 200 || !res.body.includes('data: [DONE]')) {
        console.log(`# a well-behaved stream broke: ${res ? res.status : 'no response'} ${r.error} ${r.data.toString().slice(-160)}`);
        return -1;
      }
      const usage = res.body.split('\n').filter((l) => l.includes('"usage"') && l.includes('"choices":[]'));
      return usage.length ? JSON.parse(usage[0].slice(6)).usage.completion_tokens : -1;
    });
}

const groups = {};

groups.headers = async () => {
  let r = await call(request('GET', '/health', undefined,
                             Array.from({ length: 150 }, (_, i) => `X-Field-${i}: v\r\n`).join('')));
  check(isError(r, 431, 'header fields'), '150 header fields: 431 naming the field count', show(r));
  r = await call(request('GET', '/health', undefined, `X-Big: ${'a'.repeat(100 << 10)}\r\n`));
  check(isError(r, 431, 'larger than'), 'a 100 KiB header: 431 naming the size', show(r));
  r = await call(`GET /${'a'.repeat(80 << 10)} HTTP/1.1\r\nHost: x\r\n\r\n`);
  check(isError(r, 431, 'larger than'), 'an 80 KiB request target: 431', show(r));
  // 64 MiB of small header lines as fast as the socket takes them, no key.
  const before = rssMiB();
  const line = Buffer.from('X-a: b\r\n'.repeat(8192));
  const flood = [Buffer.from('GET /v1/models HTTP/1.1\r\nHost: x\r\n')];
  for (let i = 0; i < (64 << 20) / line.length; ++i) flood.push(line);
  r = await call(flood, { waitMs: 10000, until: null });
  check(r.status === 431 && r.closedByServer, '64 MiB of headers, no key: 431 and the connection closed',
        `${show(r)} closed ${r.closedByServer}`);
  const grew = rssMiB() - before;
  measured(`header flood 64 MiB: ${r.ms} ms to the 431, resident memory +${grew.toFixed(1)} MiB`);
  check(grew < 32, 'the flood leaves resident memory within 32 MiB of before', `+${grew.toFixed(1)} MiB`);
};

groups.slowloris = async () => {
  // 500 connections sending a header line every 500 ms, never finishing.
  const n = 500, sockets = [], answers = new Array(n).fill('');
  let closed = 0;
  for (let i = 0; i < n; ++i) {
    const s = net.connect(port, host);
    s.on('data', (d) => { answers[i] += d.toString(); });
    s.on('error', () => {});
    s.on('close', () => { closed++; });
    s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\n');
    sockets.push(s);
  }
  const trickle = setInterval(() => { for (const s of sockets) if (!s.destroyed) s.write('X-Slow: 1\r\n'); }, 500);
  await sleep(300);
  const lat = [];
  for (let i = 0; i < 5; ++i) { lat.push(await healthMs()); await sleep(100); }
  const worst = Math.max(...lat);
  measured(`/health with ${n} slowloris connections held: ${lat.map((x) => x + ' ms').join(', ')}`);
  check(worst < 1000, `/health answers within 1 s while ${n} slow connections are held`, `${lat}`);
  // Past --header-timeout (2 s) every one of them gets its 408 and is closed.
  await waitFor(async () => closed === n, 6000);
  clearInterval(trickle);
  const got408 = answers.filter((a) => a.startsWith('HTTP/1.1 408') && a.includes('"code":408')).length;
  check(got408 === n && closed === n, `each of the ${n} gets a JSON 408 and is closed`, `${got408} 408s, ${closed} closed`);
  for (const s of sockets) s.destroy();

  // More slow connections than --max-connections (700): the slowest are
  // closed for new ones, and /health still answers.
  const many = [];
  for (let i = 0; i < 900; ++i) {
    const s = net.connect(port, host);
    s.on('error', () => {});
    s.write('GET /health HTTP/1.1\r\n');
    many.push(s);
  }
  await sleep(500);
  const l2 = await healthMs();
  measured(`/health with 900 slow connections over a limit of 700: ${l2} ms`);
  check(l2 < 1000, '/health answers within 1 s with more slow connections than the limit', `${l2} ms`);
  for (const s of many) s.destroy();
};

groups.body = async () => {
  let r = await call(`POST /v1/completions HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: 100\r\n\r\n{"prompt":`,
                     { waitMs: 6000 });
  check(isError(r, 408, 'body did not arrive'), 'a body shorter than its Content-Length: 408 after --body-timeout',
        show(r));
  r = await call(`POST /v1/completions HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: 100\r\n\r\n{"prompt":`,
                 { waitMs: 6000, endAfter: true });
  check(isError(r, 400, 'before its declared length'), 'a body cut short by the client: 400', show(r));
  r = await call(`POST /tokenize HTTP/1.1\r\nHost: x\r\n${auth}\r\n`);
  check(isError(r, 411, 'Content-Length'), 'a POST without a length: 411', show(r));
  r = await call(`POST /tokenize HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: -1\r\n\r\n`);
  check(isError(r, 400, 'malformed'), 'Content-Length -1: 400', show(r));
  r = await call(`POST /tokenize HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: 12abc\r\n\r\n`);
  check(isError(r, 400, 'malformed'), 'Content-Length 12abc: 400', show(r));
  r = await call(`POST /tokenize HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: 5\r\nContent-Length: 7\r\n\r\n12345`);
  check(isError(r, 400, 'malformed'), 'two different Content-Lengths: 400', show(r));
  r = await call(`POST /tokenize HTTP/1.1\r\nHost: x\r\n${auth}Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n`);
  check(isError(r, 400, 'malformed'), 'a bad chunk size: 400', show(r));
  const tok = JSON.stringify({ content: 'Hello world' });
  r = await call(`POST /tokenize HTTP/1.1\r\nHost: x\r\n${auth}Transfer-Encoding: chunked\r\n\r\n` +
                 `${tok.length.toString(16)}\r\n${tok}\r\n0\r\n\r\n`);
  check(r.status === 200 && r.json && Array.isArray(r.json.tokens), 'a chunked body: 200', show(r));
  const gz = zlib.gzipSync(tok);
  r = await call([Buffer.from(request('POST', '/tokenize', undefined,
                                      `Content-Encoding: gzip\r\nContent-Length: ${gz.length}\r\n`)), gz]);
  check(r.status === 200 && r.json && r.json.tokens.length > 0, 'a gzip body: 200', show(r));
  r = await call(request('POST', '/tokenize', tok, 'Content-Encoding: gzip\r\n'));
  check(isError(r, 400, 'not valid gzip'), 'a body that is not the gzip it claims: 400', show(r));
  const bomb = zlib.gzipSync(Buffer.alloc(64 << 20, 32));
  r = await call([Buffer.from(request('POST', '/tokenize', undefined,
                                      `Content-Encoding: gzip\r\nContent-Length: ${bomb.length}\r\n`)), bomb]);
  check(isError(r, 413, 'decodes to more than'), `a gzip bomb (${bomb.length} bytes -> 64 MiB): 413`, show(r));
  r = await call(request('POST', '/tokenize', tok, 'Content-Encoding: br\r\n'));
  check(isError(r, 415, 'not supported'), 'Content-Encoding br: 415', show(r));
  r = await call(request('POST', '/tokenize', '--x\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--x--\r\n',
                         'Content-Type: multipart/form-data; boundary=x\r\n'));
  check(isError(r, 415, 'multipart'), 'a multipart body: 415', show(r));
  r = await call(request('POST', '/tokenize', undefined, `Expect: 100-continue\r\nContent-Length: ${100 << 20}\r\n`));
  check(isError(r, 413, 'larger than') && r.all.length === 1, 'Expect: 100-continue with 100 MiB: 413 at once, no 100',
        `${r.all.map((x) => x.status)} ${show(r)}`);
  r = await call([request('POST', '/tokenize', undefined, `Expect: 100-continue\r\nContent-Length: ${tok.length}\r\n`)],
                 { waitMs: 1000 });
  const cont = r.all.length === 1 && r.all[0].status === 100;
  const r2 = await call([request('POST', '/tokenize', undefined, `Expect: 100-continue\r\nContent-Length: ${tok.length}\r\n`),
                         tok], { gapMs: 300 });
  check(cont && r2.all.length === 2 && r2.all[0].status === 100 && r2.all[1].status === 200,
        'Expect: 100-continue: 100, then the answer', `${r.all.map((x) => x.status)} / ${r2.all.map((x) => x.status)}`);
  r = await call(request('POST', '/tokenize', tok, 'Expect: something-else\r\n'));
  check(isError(r, 417, 'Expect'), 'Expect: something-else: 417', show(r));
  r = await call(request('POST', '/tokenize', '{"content": 1e400}'));
  check(isError(r, 400, 'JSON'), '1e400: 400 (not 500)', show(r));
  r = await call(request('POST', '/v1/chat/completions', '{"messages": [], "temperature": -1e400}'));
  check(isError(r, 400, 'JSON'), '-1e400 in a chat field: 400', show(r));
  r = await call(request('BREW', '/v1/completions', undefined));
  check(r.status === 405 && r.json && r.json.error, 'an unknown method on an endpoint: 405', show(r));
  r = await call(`GET /health HTTP/1.1\r\nHost: x\r\n${auth}Transfer-Encoding: gzip\r\n\r\n`);
  check(isError(r, 400, 'malformed'), 'Transfer-Encoding gzip: 400', show(r));
  r = await call('GARBAGE\r\n\r\n');
  check(isError(r, 400, 'malformed'), 'a request line that is not HTTP: 400', show(r));
};

groups.memory = async () => {
  const base = rssMiB();
  peakRss = base;
  let r = await call(request('POST', '/tokenize', JSON.stringify({ content: 'a'.repeat(2 << 20) })));
  check(isError(r, 413, 'at most 1 MiB'), '/tokenize of 2 MiB: 413 naming the limit', show(r));
  r = await call(request('POST', '/detokenize', `{"tokens":[${new Array(1000001).fill(0).join(',')}]}`));
  check(isError(r, 413, 'at most 1000000'), '/detokenize of 1,000,001 ids: 413 naming the limit', show(r));
  // The longest piece among a few candidates, a million times: over 16 MiB of text.
  r = await call(request('POST', '/tokenize', JSON.stringify({ content: ' ' + '='.repeat(64) + ' ' + '-'.repeat(64) })));
  let longest = 0, longestLen = 0;
  for (const id of r.json.tokens) {
    const d = await call(request('POST', '/detokenize', JSON.stringify({ tokens: [id] })));
    if (d.json.content.length > longestLen) { longestLen = d.json.content.length; longest = id; }
  }
  r = await call(request('POST', '/detokenize', `{"tokens":[${new Array(1000000).fill(longest).join(',')}]}`));
  check(longestLen <= 17 || isError(r, 413, 'answers at most 16 MiB'),
        `/detokenize of a million x a ${longestLen}-byte token: 413 naming the limit`, show(r));
  r = await call(request('POST', '/tokenize', '['.repeat(1 << 20)));
  check(isError(r, 400, 'deeper than 64'), 'JSON nested 2^20 deep: 400 naming the depth limit', show(r));
  r = await call(request('POST', '/detokenize', `{"tokens":[${'0,'.repeat(3 << 20)}0]}`));
  check(isError(r, 400, 'more than 1048576 JSON values'), '3M JSON values: 400 naming the limit', show(r));
  // Eight 15 MiB bodies at once, twice: parsed (chat) or refused unparsed
  // (/tokenize), or 503 while the body budget is spent.
  for (const [path, body, want] of [
    ['/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'b'.repeat(15 << 20) }] }), 400],
    ['/tokenize', JSON.stringify({ content: 'b'.repeat(15 << 20) }), 413]]) {
    const big = request('POST', path, body);
    const rs = await Promise.all(Array.from({ length: 8 }, () => call(big, { waitMs: 60000 })));
    const st = rs.map((x) => x.status);
    check(st.every((s) => s === want || s === 503) && st.includes(want),
          `8 concurrent 15 MiB ${path} bodies: ${want} or 503 each`, `${st}`);
  }
  await sleep(500);
  const after = rssMiB();
  measured(`memory abuse: resident ${base.toFixed(0)} MiB before, peak ${peakRss.toFixed(0)}, ${after.toFixed(0)} after`);
  check(peakRss - base < 256, 'resident memory grows less than 256 MiB under the memory abuse',
        `peak +${(peakRss - base).toFixed(0)} MiB`);
  check(after - base < 48, 'resident memory returns within 48 MiB of before', `+${(after - base).toFixed(0)} MiB`);
};

groups.cancel = async () => {
  // Both slots busy with long streams, one request queued (--queue 1).
  const long = JSON.stringify({ prompt: 'Long', max_tokens: 200, ignore_eos: true, stream: true });
  const holders = [];
  for (let i = 0; i < 2; ++i) {
    const s = net.connect(port, host);
    s.on('error', () => {});
    s.write(request('POST', '/v1/completions', long));
    holders.push(s);
  }
  await waitFor(async () => (await metric('requests_processing')) === 2, 10000);
  const queued = net.connect(port, host);
  queued.on('error', () => {});
  queued.write(request('POST', '/v1/completions', long));
  const q1 = await waitFor(async () => (await metric('requests_deferred')) === 1, 5000);
  let r = await call(request('POST', '/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 1 })));
  check(q1 && isError(r, 503, 'busy'), 'slots and queue full: 503', show(r));
  queued.destroy();
  const t0 = Date.now();
  const left = await waitFor(async () => (await metric('requests_deferred')) === 0, 2000);
  measured(`a queued client that disconnects leaves the queue in ${Date.now() - t0} ms`);
  const next = call(request('POST', '/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 1 })), { waitMs: 60000 });
  await sleep(200);
  for (const s of holders) s.destroy();
  r = await next;
  check(left && r.status === 200, 'a queued client that disconnects gives its place up at once', `${left} ${show(r)}`);
  await waitFor(async () => (await metric('requests_processing')) === 0, 5000);

  // A non-streaming client that disconnects frees its slot within a step.
  const tokens0 = await metric('tokens_predicted_total');
  const s = net.connect(port, host);
  s.on('error', () => {});
  s.write(request('POST', '/v1/completions', JSON.stringify({ prompt: 'Long', max_tokens: 200, ignore_eos: true })));
  await waitFor(async () => (await metric('requests_processing')) === 1, 5000);
  await sleep(200);
  s.destroy();
  const t1 = Date.now();
  const freed = await waitFor(async () => (await metric('requests_processing')) === 0, 3000);
  const ms = Date.now() - t1;
  const tokens = (await metric('tokens_predicted_total')) - tokens0;
  measured(`a non-streaming client that disconnects frees its slot in ${ms} ms (${tokens} tokens generated of 200)`);
  check(freed && tokens < 150, 'a non-streaming client that disconnects frees its slot', `${freed} ${ms} ms ${tokens}`);
};

groups.protocol = async () => {
  const tok = JSON.stringify({ content: 'Hello world' });
  const r = await call([request('GET', '/health') + request('POST', '/tokenize', tok) + request('GET', '/v1/models')],
                       { waitMs: 3000, responses: 3 });
  const st = r.all.map((x) => x.status);
  check(st.length === 3 && st.every((s) => s === 200) && r.all[0].body.includes('"ok"') &&
        r.all[1].body.includes('"tokens"') && r.all[2].body.includes('"list"'),
        'three pipelined requests answered in order', `${st} ${r.all.map((x) => x.body.slice(0, 40))}`);
  const body = JSON.stringify({ prompt: 'Hi', max_tokens: 3, stream: true });
  const h = await call(`POST /v1/completions HTTP/1.0\r\n${auth}Content-Length: ${body.length}\r\n\r\n${body}`,
                       { waitMs: 20000 });
  check(h.status === 200 && !h.headers['transfer-encoding'] && !h.headers['content-length'] && h.closedByServer &&
        h.body.includes('data: [DONE]') && !/\r\n[0-9a-f]+\r\n/.test(h.body),
        'an HTTP/1.0 stream: no chunked encoding, delimited by the close', `${JSON.stringify(h.headers)} ${h.body.slice(0, 80)}`);
  // A control token's text in a message stays text (one token if it were
  // read as the token, several as text).
  const promptTokens = async (content) => {
    const c = await call(request('POST', '/v1/chat/completions',
                                 JSON.stringify({ messages: [{ role: 'user', content }], max_tokens: 0 })));
    return c.json && c.json.usage ? c.json.usage.prompt_tokens : NaN;
  };
  const extra = (await promptTokens('<|im_end|>')) - (await promptTokens(''));
  check(extra > 1, '<|im_end|> in a user message is text, not the token', `${extra} tokens`);
  const w = await call(`GET /health HTTP/1.0\r\n\r\n`, { until: null });
  check(w.status === 200 && w.closedByServer && w.headers['content-length'], 'an HTTP/1.0 request: length, then close',
        JSON.stringify(w.headers));
};

async function shutdown() {
  // Slow clients of every kind, then SIGTERM: exit within 5 s.
  const hold = [];
  for (let i = 0; i < 300; ++i) {
    const s = net.connect(port, host);
    s.on('error', () => {});
    s.write(i % 2 ? 'GET /health HTTP/1.1\r\nX-a' : `POST /tokenize HTTP/1.1\r\n${auth}Content-Length: 1000\r\n\r\n{`);
    hold.push(s);
  }
  const stream = exchange([request('POST', '/v1/completions',
                                   JSON.stringify({ prompt: 'Long', max_tokens: 200, ignore_eos: true, stream: true }))],
                          { waitMs: 20000 });
  await sleep(700);
  const t0 = Date.now();
  process.kill(pid, 'SIGTERM');
  const gone = () => {
    try { return /State:\s+Z/.test(fs.readFileSync(`/proc/${pid}/status`, 'utf8')); } catch (e) { return true; }
  };
  await waitFor(async () => gone(), 10000);
  const ms = Date.now() - t0;
  measured(`SIGTERM with 300 slow clients and a stream open: exited in ${ms} ms`);
  check(gone() && ms < 5000, 'SIGTERM exits within 5 s whatever the clients do', `${ms} ms`);
  const s = await stream;
  check(s.data.toString().includes('data: [DONE]'), 'the open stream ends with [DONE]', s.data.toString().slice(-200));
  for (const x of hold) x.destroy();
}

async function main() {
  const names = only.length ? only : Object.keys(groups);
  if (!(await waitFor(async () => (await healthMs()) < Infinity, 60000))) {
    console.log('FAIL the server did not become healthy');
    process.exit(1);
  }
  // Well-behaved streams all through the abuse.
  const streams = [];
  let stopLoad = false;
  const loader = (async () => {
    while (!stopLoad) {
      streams.push(await wellBehavedStream(24));
    }
  })();
  for (const n of names) {
    if (n === 'cancel' || n === 'shutdown') continue;  // below, without the load
    const t0 = Date.now();
    await groups[n]();
    console.log(`# ${n}: ${Date.now() - t0} ms`);
  }
  stopLoad = true;
  await loader;
  check(streams.length > 0 && streams.every((t) => t === 24),
        `${streams.length} well-behaved streams through the abuse, each with all its 24 tokens`, `${streams}`);
  if (names.includes('cancel')) {
    console.log('# cancel');
    await groups.cancel();
  }
  if (!only.length || only.includes('shutdown')) {
    console.log('# shutdown');
    await shutdown();
  }
  clearInterval(rssSampler);
  console.log(`${fails} failures`);
  process.exit(fails ? 1 : 0);
}

main().catch((e) => { console.log(`FAIL uncaught: ${e.stack}`); process.exit(1); });
