// Drives a running dpl-server with the official OpenAI client library (npm
// "openai" 6), as an application would: chat and completions, streaming and
// not, usage, tools with tool_choice "required" (arguments that validate
// against the tool's schema) and a tool result continuing the conversation,
// response_format json_schema (an answer that validates), logprobs (chat's
// top_logprobs, completions' echo scoring), the Responses API,
// any model name, and the errors the client raises for a bad field and a bad key.
//   node openai_client.js BASE_URL API_KEY MODEL
// Prints "ok   NAME" / "FAIL NAME" lines; exits 1 on any failure.
'use strict';
const OpenAI = require('openai');
const { harness, lightArgs, record, z } = require('./harness');

const [baseURL, apiKey, model] = process.argv.slice(2);
const { check, expect, run, fetch } = harness('openai client');

async function main() {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000, fetch });
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello' }];

  await check('chat.completions.create', async () => {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0 });
    expect(r.object === 'chat.completion', `object ${r.object}`);
    expect(r.choices.length === 1 && r.choices[0].message.role === 'assistant', 'one assistant choice');
    expect(typeof r.choices[0].message.content === 'string', 'content');
    expect(['stop', 'length'].includes(r.choices[0].finish_reason), `finish ${r.choices[0].finish_reason}`);
    expect(r.usage.completion_tokens <= 4 && r.usage.prompt_tokens > 0, JSON.stringify(r.usage));
    expect(r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, 'total');
  });

  await check('chat stream with include_usage', async () => {
    const stream = await client.chat.completions.create({
      model, messages, max_tokens: 5, temperature: 0, stream: true, stream_options: { include_usage: true },
      ignore_eos: true,
    });
    let text = '', finish = null, usage = null, chunks = 0;
    for await (const chunk of stream) {
      chunks++;
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta && c.delta.content) text += c.delta.content;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    expect(chunks >= 3, `${chunks} chunks`);
    expect(finish === 'length', `finish ${finish}`);
    expect(usage && usage.completion_tokens === 5, `usage ${JSON.stringify(usage)}`);
    // Greedy: the stream's text is the non-streamed answer's.
    const whole = await client.chat.completions.create({ model, messages, max_tokens: 5, temperature: 0, ignore_eos: true });
    expect(whole.choices[0].message.content === text, `stream '${text}' vs '${whole.choices[0].message.content}'`);
  });

  await check('completions.create (text and token ids)', async () => {
    const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 3, temperature: 0 });
    expect(r.object === 'text_completion' && typeof r.choices[0].text === 'string', JSON.stringify(r));
    const ids = await client.completions.create({ model, prompt: [9707, 1879], max_tokens: 2, temperature: 0 });
    expect(ids.usage.prompt_tokens === 2, JSON.stringify(ids.usage));
  });

  await check('completions stream', async () => {
    const stream = await client.completions.create({ model, prompt: 'Hi', max_tokens: 3, stream: true, seed: 7 });
    let finish = null;
    for await (const chunk of stream) if (chunk.choices[0] && chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
    expect(finish !== null, 'no finish_reason');
  });

  await check('logprobs: chat top_logprobs, completions echo scoring (max_tokens 0)', async () => {
    const r = await client.chat.completions.create({
      model, messages, max_tokens: 3, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 2,
    });
    const content = r.choices[0].logprobs && r.choices[0].logprobs.content;
    expect(Array.isArray(content) && content.length === 3, JSON.stringify(r.choices[0]));
    for (const e of content) {
      expect(typeof e.token === 'string' && e.logprob <= 0 && Array.isArray(e.bytes), JSON.stringify(e));
      expect(e.top_logprobs.length === 2 && e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob, JSON.stringify(e));
    }
    const c = await client.completions.create({ model, prompt: [9707, 1879, 13], max_tokens: 0, echo: true, logprobs: 1 });
    const lp = c.choices[0].logprobs;
    expect(c.choices[0].finish_reason === 'length' && c.usage.completion_tokens === 0, JSON.stringify(c));
    expect(lp.tokens.length === 3 && lp.token_logprobs[0] === null && lp.top_logprobs[0] === null, JSON.stringify(lp));
    expect(lp.token_logprobs.slice(1).every((x) => typeof x === 'number' && x <= 0), JSON.stringify(lp));
    expect(lp.top_logprobs.slice(1).every((t) => Object.keys(t).length === 1), JSON.stringify(lp));
    expect(c.choices[0].text === lp.tokens.join(''), JSON.stringify(c.choices[0]));
  });

  await check('models.list', async () => {
    const list = await client.models.list();
    expect(list.data.some((m) => m.id === model), JSON.stringify(list.data));
  });

  await check('completions.create with a list of prompts: a choice each', async () => {
    const r = await client.completions.create({ model, prompt: ['Once', 'Hello'], max_tokens: 2, ignore_eos: true });
    expect(r.choices.length === 2 && r.choices[1].index === 1 && r.usage.completion_tokens === 4, JSON.stringify(r));
  });

  await check('responses.create (Responses API), whole and streamed', async () => {
    const r = await client.responses.create({ model, input: 'Hello', instructions: 'Be brief', max_output_tokens: 4 });
    expect(r.object === 'response' && typeof r.output_text === 'string', JSON.stringify(r));
    expect(['completed', 'incomplete'].includes(r.status), r.status);
    expect(r.usage.output_tokens <= 4 && r.usage.input_tokens > 0, JSON.stringify(r.usage));
    const stream = await client.responses.create({ model, input: [{ role: 'user', content: 'Hi' }], max_output_tokens: 3, stream: true });
    let text = '', last = null;
    for await (const e of stream) {
      if (e.type === 'response.output_text.delta') text += e.delta;
      last = e;
    }
    expect(['response.completed', 'response.incomplete'].includes(last.type), last.type);
    expect(last.response.output[0].content[0].text === text, `${JSON.stringify(last.response)} vs ${text}`);
  });

  // Tools: the schema is zod's own JSON schema of lightArgs.
  const tools = [{
    type: 'function',
    function: { name: 'set_light', description: 'Switches the light', parameters: z.toJSONSchema(lightArgs) },
  }];
  const ask = [{ role: 'user', content: 'Turn the light on, red.' }];
  let call = null;
  await check('tools with tool_choice "required": a call whose arguments validate', async () => {
    const r = await client.chat.completions.create({
      model, messages: ask, tools, tool_choice: 'required', parallel_tool_calls: false, temperature: 0, max_tokens: 64,
    });
    const c = r.choices[0];
    expect(c.finish_reason === 'tool_calls', `finish ${c.finish_reason}`);
    expect(c.message.tool_calls && c.message.tool_calls.length === 1, JSON.stringify(c.message));
    call = c.message.tool_calls[0];
    expect(call.type === 'function' && call.function.name === 'set_light', JSON.stringify(call));
    expect(typeof call.id === 'string' && call.id.length > 0, `id ${call.id}`);
    lightArgs.strict().parse(JSON.parse(call.function.arguments));
  });

  await check('a tool message with tool_call_id continues the conversation', async () => {
    expect(call, 'no call from the check before');
    const r = await client.chat.completions.create({
      model, temperature: 0, max_tokens: 4, tools,
      messages: [...ask, { role: 'assistant', content: null, tool_calls: [call] },
        { role: 'tool', tool_call_id: call.id, content: 'done' }],
    });
    const c = r.choices[0];
    expect(['stop', 'length', 'tool_calls'].includes(c.finish_reason), `finish ${c.finish_reason}`);
    expect(c.message.role === 'assistant' && r.usage.prompt_tokens > 0, JSON.stringify(r));
  });

  await check('tools, streamed with tool_choice "required": the call assembles from its deltas', async () => {
    const stream = await client.chat.completions.create({
      model, messages: ask, tools, tool_choice: 'required', parallel_tool_calls: false, temperature: 0, max_tokens: 64,
      stream: true,
    });
    let name = '', args = '', finish = null;
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        for (const t of (c.delta && c.delta.tool_calls) || []) {
          if (t.function && t.function.name) name += t.function.name;
          if (t.function && t.function.arguments) args += t.function.arguments;
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    expect(finish === 'tool_calls' && name === 'set_light', `finish ${finish}, name ${name}`);
    lightArgs.strict().parse(JSON.parse(args));
  });

  await check('response_format json_schema: the answer validates', async () => {
    const r = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'A record, please.' }], temperature: 0, max_tokens: 96,
      response_format: { type: 'json_schema', json_schema: { name: 'record', strict: true, schema: z.toJSONSchema(record) } },
    });
    const c = r.choices[0];
    expect(c.finish_reason === 'stop', `finish ${c.finish_reason}: ${c.message.content}`);
    record.strict().parse(JSON.parse(c.message.content));
  });

  await check('responses.create with a function tool and tool_choice "required"', async () => {
    const r = await client.responses.create({
      model, input: 'Turn the light on, red.', temperature: 0, max_output_tokens: 64, tool_choice: 'required',
      tools: [{ type: 'function', name: 'set_light', parameters: z.toJSONSchema(lightArgs), strict: true }],
    });
    const calls = r.output.filter((o) => o.type === 'function_call');
    expect(calls.length >= 1 && calls[0].name === 'set_light' && calls[0].call_id, JSON.stringify(r.output));
    lightArgs.strict().parse(JSON.parse(calls[0].arguments));
  });

  await check("any model name is served (a client's own default)", async () => {
    const r = await client.chat.completions.create({ model: 'gpt-4o-mini', messages, max_tokens: 1 });
    expect(r.model === model && r.choices.length === 1, JSON.stringify(r));
  });

  await check('bad field: BadRequestError (400) naming it', async () => {
    try {
      await client.chat.completions.create({ model, messages, temperature: 'hot' });
    } catch (e) {
      expect(e instanceof OpenAI.BadRequestError && /temperature/.test(e.message), `${e.constructor.name} ${e.message}`);
      return;
    }
    throw new Error('no error');
  });

  await check('wrong API key: AuthenticationError (401)', async () => {
    const wrong = new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 });
    try {
      await wrong.models.list();
    } catch (e) {
      expect(e instanceof OpenAI.AuthenticationError && e.status === 401, `${e.constructor.name} ${e.status}`);
      return;
    }
    throw new Error('no error');
  });
}

run(main);
