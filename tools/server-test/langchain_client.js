// Drives a running dpl-server with LangChain JS (npm "@langchain/openai"'s
// ChatOpenAI) as an application would: invoke, stream, bindTools with
// tool_choice "any" (sent as "required") giving tool_calls whose args
// validate, withStructuredOutput with a zod schema (its default json_schema
// method, and function calling) returning a parsed object, and
// useResponsesApi: true.
//   node langchain_client.js BASE_URL API_KEY MODEL
// Prints "ok   NAME" / "FAIL NAME" lines; exits 1 on any failure.
'use strict';
const { ChatOpenAI } = require('@langchain/openai');
const { HumanMessage, ToolMessage } = require('@langchain/core/messages');
const { tool } = require('@langchain/core/tools');
const { harness, lightArgs, record } = require('./harness');

const [baseURL, apiKey, model] = process.argv.slice(2);
const { check, expect, run, fetch, sentBodies, sentUrls } = harness('langchain');

async function main() {
  const chat = (more = {}) => new ChatOpenAI({
    model, apiKey, temperature: 0, maxTokens: 6, maxRetries: 0, configuration: { baseURL, fetch }, ...more,
  });

  await check('invoke', async () => {
    const m = await chat().invoke('Hello');
    expect(typeof m.content === 'string' && m.content.length > 0, `content ${JSON.stringify(m.content)}`);
    expect(['stop', 'length'].includes(m.response_metadata.finish_reason), JSON.stringify(m.response_metadata));
    expect(m.usage_metadata.output_tokens > 0 && m.usage_metadata.output_tokens <= 6 && m.usage_metadata.input_tokens > 0,
      JSON.stringify(m.usage_metadata));
  });

  await check('stream', async () => {
    let text = '', chunks = 0, usage = null;
    for await (const c of await chat({ streamUsage: true }).stream('Hello')) {
      chunks++;
      if (typeof c.content === 'string') text += c.content;
      if (c.usage_metadata) usage = c.usage_metadata;
    }
    expect(chunks >= 2 && text.length > 0, `${chunks} chunks: ${JSON.stringify(text)}`);
    expect(usage && usage.output_tokens > 0 && usage.output_tokens <= 6, `usage ${JSON.stringify(usage)}`);
  });

  const setLight = tool(async () => 'done', { name: 'set_light', description: 'Switches the light', schema: lightArgs });
  const ask = new HumanMessage('Turn the light on, red.');
  await check('bindTools with tool_choice "any": tool_calls whose args validate, a ToolMessage continues', async () => {
    const m = await chat({ maxTokens: 64 }).bindTools([setLight], { tool_choice: 'any', parallel_tool_calls: false }).invoke([ask]);
    expect(JSON.parse(sentBodies()[0]).tool_choice === 'required', `sent ${sentBodies()[0]}`);
    expect(m.tool_calls.length === 1 && m.tool_calls[0].name === 'set_light', JSON.stringify(m.tool_calls));
    expect(typeof m.tool_calls[0].id === 'string' && m.tool_calls[0].id.length > 0, JSON.stringify(m.tool_calls[0]));
    lightArgs.strict().parse(m.tool_calls[0].args);
    expect(m.response_metadata.finish_reason === 'tool_calls', JSON.stringify(m.response_metadata));
    const result = await setLight.invoke(m.tool_calls[0]);
    expect(result instanceof ToolMessage && result.tool_call_id === m.tool_calls[0].id, JSON.stringify(result));
    const next = await chat().bindTools([setLight]).invoke([ask, m, result]);
    expect(typeof next.content === 'string', JSON.stringify(next));
  });

  await check('withStructuredOutput (zod, json_schema): a parsed object', async () => {
    const r = await chat({ maxTokens: 96 }).withStructuredOutput(record, { name: 'record' }).invoke('A record, please.');
    record.strict().parse(r);
    expect(JSON.parse(sentBodies()[0]).response_format.type === 'json_schema', `sent ${sentBodies()[0]}`);
  });

  await check('withStructuredOutput (zod, functionCalling): a parsed object', async () => {
    const r = await chat({ maxTokens: 64 }).withStructuredOutput(lightArgs, { name: 'set_light', method: 'functionCalling' })
      .invoke('Turn the light on, red.');
    lightArgs.strict().parse(r);
  });

  await check('useResponsesApi: invoke and stream', async () => {
    const m = await chat({ useResponsesApi: true }).invoke('Hello');
    expect(sentUrls().length === 1 && sentUrls()[0].endsWith('/responses'), `sent to ${sentUrls()}`);
    expect(m.text.length > 0, `text ${JSON.stringify(m.content)}`);
    expect(m.usage_metadata.output_tokens > 0 && m.usage_metadata.output_tokens <= 6, JSON.stringify(m.usage_metadata));
    let text = '';
    for await (const c of await chat({ useResponsesApi: true }).stream('Hello')) text += c.text;
    expect(text.length > 0, `streamed ${JSON.stringify(text)}`);
  });

  // With the Responses API, @langchain/openai 1.5.8 drops a string
  // tool_choice ("any", "required": its responses.js keeps only objects), so
  // the call is forced by naming the tool ({"type": "function", "name"}).
  await check('useResponsesApi: bindTools with tool_choice naming the tool', async () => {
    const m = await chat({ useResponsesApi: true, maxTokens: 64 }).bindTools([setLight], { tool_choice: 'set_light' }).invoke([ask]);
    expect(JSON.parse(sentBodies()[0]).tool_choice.name === 'set_light', `sent ${sentBodies()[0]}`);
    expect(m.tool_calls.length >= 1 && m.tool_calls[0].name === 'set_light', JSON.stringify(m.tool_calls));
    lightArgs.strict().parse(m.tool_calls[0].args);
  });
}

run(main);
