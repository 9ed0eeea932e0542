// Drives dpl-server's chat page (GET /, runtime/server/chat_page.html) in
// Debian's headless chromium through puppeteer-core, as a person would: the
// page loads with no console error and no failed request; a message typed and
// sent (Enter) streams an assistant reply that grows, then the page is idle
// again (Send enabled, Stop disabled); Stop ends a long reply (no more text
// after it, not shown as an error, the server's slot freed: the next message
// completes); the conversation (whole history sent each turn) survives a
// reload from localStorage; "New chat" clears it. The server runs without an
// API key (the key field left empty). The model has random weights: only
// behaviour is checked, never text. The page sends no max_tokens: the test
// adds max_tokens / ignore_eos to its requests (request interception) so a
// reply is short, or long enough to stop.
//   node chat_page_client.js BASE_URL API_KEY MODEL   (API_KEY unused, "")
// Prints "ok   NAME" / "FAIL NAME" lines; exits 1 on any failure.
'use strict';
const fs = require('fs');
const puppeteer = require('puppeteer-core');
const { harness } = require('./harness');

const [baseURL] = process.argv.slice(2);
const origin = baseURL.replace(/\/v1\/?$/, '');
const chromium = process.env.DPL_CHROMIUM || '/usr/bin/chromium';
const { check, expect, run } = harness('chat page');

async function main() {
  if (!fs.existsSync(chromium)) {
    console.log(`FAIL chat page: no ${chromium}: run tools/setup.sh (it installs Debian's chromium)`);
    process.exit(1);
  }
  const browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true, // --headless=new
    args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  try {
    await drive(await browser.newPage());
  } finally {
    await browser.close();
  }
}

async function drive(page) {
  // Everything that went wrong in the browser: console errors, page errors,
  // failed requests (but the stopped stream's), HTTP errors.
  const problems = [];
  let stopping = false;
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('requestfailed', (r) => {
    const aborted = stopping && r.url().endsWith('/v1/chat/completions');
    if (!aborted) problems.push(`request failed: ${r.method()} ${r.url()} ${r.failure() && r.failure().errorText}`);
  });
  page.on('response', (r) => { if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.url()}`); });

  // The page's chat requests (bodies as the page sent them), with `extra`
  // merged into what reaches the server.
  const sent = [];
  let extra = {};
  await page.setRequestInterception(true);
  page.on('request', (req) => {
    if (req.method() === 'POST' && req.url().endsWith('/v1/chat/completions')) {
      const body = JSON.parse(req.postData());
      sent.push(body);
      req.continue({ postData: JSON.stringify({ ...body, ...extra }) });
    } else {
      req.continue();
    }
  });

  const state = () => page.evaluate(() => {
    const msgs = [...document.querySelectorAll('#log .msg')];
    return {
      msgs: msgs.map((d) => ({ cls: d.className, text: d.textContent })),
      send: document.getElementById('send').disabled,
      stop: document.getElementById('stop').disabled,
      input: document.getElementById('input').value,
      stored: JSON.parse(localStorage.getItem('dpl.messages') || '[]'),
    };
  });
  // Lengths of the last message's text at each change of #log (growth while streaming).
  const watch = () => page.evaluate(() => {
    window.__lens = [];
    new MutationObserver(() => {
      const last = [...document.querySelectorAll('#log .msg')].pop();
      if (last && last.classList.contains('assistant')) window.__lens.push(last.textContent.length);
    }).observe(document.getElementById('log'), { childList: true, subtree: true, characterData: true });
  });
  const lastText = () => page.evaluate(() => [...document.querySelectorAll('#log .msg')].pop().textContent);
  const idle = (timeout) => page.waitForFunction(() => !document.getElementById('send').disabled, { timeout });
  async function type(text) {
    await page.click('#input');
    await page.keyboard.type(text);
    await page.keyboard.press('Enter');
  }

  await check('the page at / loads with no console error or failed request', async () => {
    const res = await page.goto(`${origin}/`, { waitUntil: 'networkidle0', timeout: 15000 });
    expect(res.status() === 200, `GET / -> ${res.status()}`);
    expect((await page.title()) === 'dpl chat', `title ${await page.title()}`);
    await page.waitForFunction(() => document.getElementById('model').textContent.startsWith('dpl: '), { timeout: 5000 });
    const s = await state();
    expect(s.msgs.length === 0 && !s.send && s.stop, `fresh page ${JSON.stringify(s)}`);
    expect(problems.length === 0, problems.join('; '));
  });

  await check('a sent message streams a reply that grows, then the page is idle', async () => {
    extra = { max_tokens: 48, ignore_eos: true };
    await watch();
    await type('Hello there');
    const during = await state();
    expect(during.input === '' && during.send && !during.stop, `while streaming: ${JSON.stringify(during)}`);
    expect(during.msgs[0].cls === 'msg user' && during.msgs[0].text === 'Hello there', `user message ${JSON.stringify(during.msgs)}`);
    await idle(20000);
    const s = await state();
    const lens = await page.evaluate(() => window.__lens);
    expect(s.msgs.length === 2 && s.msgs[1].cls === 'msg assistant' && s.msgs[1].text.length > 0, `after: ${JSON.stringify(s.msgs)}`);
    expect(!s.send && s.stop, 'Send enabled, Stop disabled when done');
    const distinct = lens.filter((n, i) => n > 0 && n !== lens[i - 1]);
    expect(distinct.length >= 3 && distinct.every((n, i) => i === 0 || n > distinct[i - 1]), `text lengths while streaming ${lens}`);
    expect(sent.length === 1 && sent[0].stream === true && JSON.stringify(sent[0].messages) === JSON.stringify([{ role: 'user', content: 'Hello there' }]),
      `request ${JSON.stringify(sent)}`);
    expect(s.stored.length === 2 && s.stored[1].role === 'assistant' && s.stored[1].content.length > 0, `stored ${JSON.stringify(s.stored)}`);
  });

  await check('Stop ends a long reply: no more text, no error, ready for the next message', async () => {
    extra = { ignore_eos: true }; // the page's own length: to the end of the context
    await type('Tell me a long story');
    await page.waitForFunction(() => {
      const last = [...document.querySelectorAll('#log .msg')].pop();
      return last.classList.contains('assistant') && last.textContent.length >= 20;
    }, { timeout: 15000 });
    stopping = true;
    await page.click('#stop');
    await idle(3000);
    const a = await lastText();
    await new Promise((r) => setTimeout(r, 1500));
    const s = await state();
    stopping = false;
    expect(s.msgs.length === 4 && s.msgs[3].cls === 'msg assistant', `after stop: ${JSON.stringify(s.msgs.map((m) => m.cls))}`);
    expect(s.msgs[3].text === a && a.length >= 20, `text after stop: ${a.length} then ${s.msgs[3].text.length} chars`);
    expect(!s.send && s.stop, 'Send enabled, Stop disabled after stop');
    expect(sent.length === 2 && sent[1].messages.length === 3 && sent[1].messages[1].role === 'assistant', `history sent ${JSON.stringify(sent[1])}`);
    expect(s.stored.length === 4 && s.stored[3].content.length > 0, `the partial reply kept: ${JSON.stringify(s.stored.map((m) => m.role))}`);
  });

  await check('after Stop the next message completes (the server freed the slot)', async () => {
    extra = { max_tokens: 8, ignore_eos: true };
    await type('Thanks');
    await idle(8000); // a slot still held by the stopped reply (-np 1) would keep this waiting
    const s = await state();
    expect(s.msgs.length === 6 && s.msgs[5].cls === 'msg assistant' && s.msgs[5].text.length > 0, `after: ${JSON.stringify(s.msgs)}`);
    expect(sent.length === 3 && sent[2].messages.length === 5, `history sent ${sent.length}`);
  });

  await check('the conversation survives a reload (localStorage)', async () => {
    const before = (await state()).msgs;
    await page.reload({ waitUntil: 'networkidle0', timeout: 15000 });
    const after = (await state()).msgs;
    expect(JSON.stringify(after) === JSON.stringify(before), `before ${JSON.stringify(before)}\nafter ${JSON.stringify(after)}`);
  });

  await check('New chat clears the conversation, also after a reload', async () => {
    await page.click('#new');
    let s = await state();
    expect(s.msgs.length === 0 && s.stored.length === 0, `after New chat: ${s.msgs.length} shown, ${s.stored.length} stored`);
    await page.reload({ waitUntil: 'networkidle0', timeout: 15000 });
    s = await state();
    expect(s.msgs.length === 0, `after reload: ${s.msgs.length} shown`);
  });

  await check('no console error, page error or failed request throughout', async () => {
    expect(problems.length === 0, problems.join('; '));
  });
}

run(main);
