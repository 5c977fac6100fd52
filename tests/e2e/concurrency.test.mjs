// Continuous batching on the CPU tiny model: 64 concurrent greedy streams at --max-num-seqs 8
// give exactly the tokens each gives alone; clients that disconnect free their slots.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { setTimeout as sleep } from 'node:timers/promises';
import { startServer, metrics } from './harness.mjs';

let srv;
let client;

before(async () => {
  srv = await startServer(['--max-num-seqs', '8', '--max-model-len', '16384', '--max-num-batched-tokens', '256']);
  client = new OpenAI({ apiKey: 'none', baseURL: srv.apiURL, maxRetries: 0, timeout: 300000 });
});

after(async () => {
  const e = await srv.stop();
  assert.equal(e.code, 0);
});

const N = 64;
const prompt = (i) => `Request number ${i}: tell me something about the number ${i * 7 + 3}.` + ' More words.'.repeat(i % 9);

// Streams one greedy chat request; returns the generated tokens (from logprobs, one per token).
async function streamTokens(i, maxTokens) {
  const s = await client.chat.completions.create({
    model: 'gpt-oss-tiny', messages: [{ role: 'user', content: prompt(i) }], max_tokens: maxTokens,
    temperature: 0, logprobs: true, stream: true, stream_options: { include_usage: true },
  });
  const toks = [];
  let usage = null;
  let finish = null;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    if (!ch.choices.length) continue;
    for (const l of ch.choices[0].logprobs?.content ?? []) toks.push(l.bytes.join(','));
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  return { toks, usage, finish };
}

test('64 concurrent streams at --max-num-seqs 8 equal the same requests run alone', async () => {
  const maxTokens = 12;
  const alone = [];
  for (let i = 0; i < N; i++) alone.push(await streamTokens(i, maxTokens));
  const before = await metrics(srv.baseURL);
  const together = await Promise.all(Array.from({ length: N }, (_, i) => streamTokens(i, maxTokens)));
  for (let i = 0; i < N; i++) {
    assert.ok(together[i].finish, `request ${i} finished`);
    assert.equal(together[i].usage.completion_tokens, together[i].toks.length);
    assert.deepEqual(together[i].toks, alone[i].toks, `request ${i} differs from its run alone`);
    // The same prompts again: the prefix cache serves whole pages of them (same tokens anyway).
    const { prompt_tokens_details: cachedTogether, ...usageTogether } = together[i].usage;
    const { prompt_tokens_details: cachedAlone, ...usageAlone } = alone[i].usage;
    assert.deepEqual(usageTogether, usageAlone);
    assert.equal(cachedTogether.cached_tokens % 16, 0);
    assert.ok(cachedTogether.cached_tokens < usageTogether.prompt_tokens);
  }
  let m = await metrics(srv.baseURL);
  // the gauges are published at the end of the engine step that sent the last tokens
  for (let i = 0; i < 100 && (m['gptoss:num_requests_running'] > 0 || m['gptoss:num_requests_waiting'] > 0); i++) {
    await sleep(20);
    m = await metrics(srv.baseURL);
  }
  assert.equal(m['gptoss:request_finished_total'] - before['gptoss:request_finished_total'], N, 'none lost');
  assert.equal(m['gptoss:num_requests_running'], 0);
  assert.equal(m['gptoss:num_requests_waiting'], 0);
});

test('clients that disconnect mid-stream free their slot', async () => {
  const m0 = await metrics(srv.baseURL);
  // Fill all 8 slots with very long streams, read a few chunks, then vanish.
  const streams = await Promise.all(Array.from({ length: 8 }, (_, i) => client.chat.completions.create({
    model: 'gpt-oss-tiny', messages: [{ role: 'user', content: `long story ${i}` }], max_tokens: 15000,
    logprobs: true, stream: true, ignore_eos: true,
  })));
  await Promise.all(streams.map(async (s) => {
    let n = 0;
    for await (const ch of s) {
      if (++n >= 3) break; // leaving the loop aborts the request
    }
  }));
  let m = await metrics(srv.baseURL);
  for (let i = 0; i < 500 && (m['gptoss:num_requests_running'] > 0 || m['gptoss:num_requests_waiting'] > 0); i++) {
    await sleep(20);
    m = await metrics(srv.baseURL);
  }
  assert.equal(m['gptoss:num_requests_running'], 0, 'slots freed');
  assert.ok(m['gptoss:request_aborted_total'] - m0['gptoss:request_aborted_total'] >= 8);
  assert.ok(m['gptoss:generation_tokens_total'] - m0['gptoss:generation_tokens_total'] < 8 * 15000);
  assert.equal(m['gptoss:kv_cache_pages_used_full'], 0, 'KV pages returned');
  // the slots serve new requests
  const r = await streamTokens(1, 4);
  assert.ok(r.finish);
});
