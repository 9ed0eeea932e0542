// Drives a running dpl-server with Vercel's AI SDK (npm "ai") as an
// application would: @ai-sdk/openai-compatible's chat model for generateText,
// streamText, generateObject with a zod schema (supportsStructuredOutputs:
// the schema goes as response_format json_schema, the object must parse),
// generateText with a tool and toolChoice 'required' (no
// ToolChoiceViolationError; the call's input validates), and @ai-sdk/openai's
// default model (the Responses API) pointed at the server.
//   node ai_sdk_client.js BASE_URL API_KEY MODEL
// Prints "ok   NAME" / "FAIL NAME" lines; exits 1 on any failure.
'use strict';
const { generateText, streamText, generateObject, tool } = require('ai');
const { createOpenAICompatible } = require('@ai-sdk/openai-compatible');
const { createOpenAI } = require('@ai-sdk/openai');
const { harness, lightArgs, record } = require('./harness');

const [baseURL, apiKey, modelName] = process.argv.slice(2);
const { check, expect, run, fetch, sentBodies } = harness('ai sdk');

async function main() {
  const provider = createOpenAICompatible({
    name: 'dpl', baseURL, apiKey, fetch, includeUsage: true, supportsStructuredOutputs: true,
  });
  const model = provider.chatModel(modelName);
  const common = { model, temperature: 0, maxRetries: 0, prompt: 'Hello' };

  await check('generateText', async () => {
    const r = await generateText({ ...common, maxOutputTokens: 6 });
    expect(typeof r.text === 'string' && r.text.length > 0, `text ${JSON.stringify(r.text)}`);
    expect(['stop', 'length'].includes(r.finishReason), `finish ${r.finishReason}`);
    expect(r.usage.outputTokens > 0 && r.usage.outputTokens <= 6 && r.usage.inputTokens > 0, JSON.stringify(r.usage));
  });

  await check('streamText', async () => {
    const r = streamText({ ...common, maxOutputTokens: 6, onError: ({ error }) => { throw error; } });
    let text = '', parts = 0;
    for await (const delta of r.textStream) { text += delta; parts++; }
    expect(parts >= 2 && text.length > 0, `${parts} parts: ${JSON.stringify(text)}`);
    expect(['stop', 'length'].includes(await r.finishReason), `finish ${await r.finishReason}`);
    const usage = await r.usage;
    expect(usage.outputTokens > 0 && usage.outputTokens <= 6, JSON.stringify(usage));
  });

  await check('generateObject with a zod schema (response_format json_schema)', async () => {
    const r = await generateObject({ ...common, prompt: 'A record, please.', schema: record, maxOutputTokens: 96 });
    record.strict().parse(r.object);
    expect(r.finishReason === 'stop', `finish ${r.finishReason}`);
    const sent = JSON.parse(sentBodies()[0]);
    expect(sent.response_format && sent.response_format.type === 'json_schema', `sent ${JSON.stringify(sent.response_format)}`);
  });

  await check("generateText with a tool and toolChoice 'required'", async () => {
    let executed = null;
    const r = await generateText({
      ...common, prompt: 'Turn the light on, red.', maxOutputTokens: 64, toolChoice: 'required',
      tools: { set_light: tool({ description: 'Switches the light', inputSchema: lightArgs, execute: async (a) => { executed = a; return 'done'; } }) },
    });
    expect(r.finishReason === 'tool-calls', `finish ${r.finishReason}`);
    expect(r.toolCalls.length >= 1 && r.toolCalls[0].toolName === 'set_light', JSON.stringify(r.toolCalls));
    lightArgs.strict().parse(r.toolCalls[0].input);
    expect(executed !== null, 'the tool did not run');
    expect(r.toolResults.length >= 1 && r.toolResults[0].output === 'done', JSON.stringify(r.toolResults));
  });

  const openai = createOpenAI({ baseURL, apiKey, fetch });
  await check("@ai-sdk/openai's default model (the Responses API)", async () => {
    const r = await generateText({ model: openai(modelName), prompt: 'Hello', temperature: 0, maxOutputTokens: 6, maxRetries: 0 });
    expect(typeof r.text === 'string' && r.text.length > 0, `text ${JSON.stringify(r.text)}`);
    expect(['stop', 'length'].includes(r.finishReason), `finish ${r.finishReason}`);
    expect(r.usage.outputTokens > 0 && r.usage.inputTokens > 0, JSON.stringify(r.usage));
  });

  await check("@ai-sdk/openai's default model, streamed", async () => {
    const r = streamText({ model: openai(modelName), prompt: 'Hello', temperature: 0, maxOutputTokens: 6, maxRetries: 0, onError: ({ error }) => { throw error; } });
    let text = '';
    for await (const delta of r.textStream) text += delta;
    expect(text.length > 0, `text ${JSON.stringify(text)}`);
    expect(['stop', 'length'].includes(await r.finishReason), `finish ${await r.finishReason}`);
  });
}

run(main);
