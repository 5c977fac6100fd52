// KV-cache exhaustion under load on the CPU tiny model: 64 concurrent requests on a cache of
// 24 pages force preemption (and recompute); in --batch-invariant mode every request still gets
// all its tokens (--max-model-len 384: the server refuses one the cache cannot hold), and exactly the text it gets when it runs alone (checked for every 4th).
// The server schedules asynchronously (--async-scheduling): sequences in flight are preempted too.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { startServer, metrics } from './harness.mjs';

let srv;

before(async () => {
  srv = await startServer(['--max-num-seqs', '64', '--kv-cache-tokens', '384', '--max-model-len', '384',
    '--max-num-batched-tokens', '512', '--batch-invariant', '--async-scheduling']);
});

after(async () => {
  const e = await srv.stop();
  assert.equal(e.code, 0);
});

const N = 64;
const MAX_TOKENS = 32;
// Token-id prompts of 6..25 tokens: prompt + 32 positions need 3-4 pages of 16 each.
const prompt = (i) => Array.from({ length: 6 + (i * 7) % 20 }, (_, k) => 1000 + ((i * 131 + k * 17) % 5000));

async function complete(i) {
  const r = await fetch(`${srv.apiURL}/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-oss-tiny', prompt: prompt(i), max_tokens: MAX_TOKENS, temperature: 0, ignore_eos: true }),
  });
  assert.equal(r.status, 200, `request ${i}: ${await r.clone().text()}`);
  return r.json();
}

test('64 concurrent requests through forced preemption all complete, equal to each run alone', async () => {
  const alone = [];
  for (let i = 0; i < N; i += 4) alone[i] = await complete(i);
  const m0 = await metrics(srv.baseURL);
  assert.equal(m0['gptoss:num_preemptions_total'], 0, 'one at a time fits the cache');
  const together = await Promise.all(Array.from({ length: N }, (_, i) => complete(i)));
  for (let i = 0; i < N; i++) {
    const c = together[i].choices[0];
    assert.equal(c.finish_reason, 'length', `request ${i}`);
    assert.equal(together[i].usage.completion_tokens, MAX_TOKENS, `request ${i} got all its tokens`);
    if (alone[i]) assert.equal(c.text, alone[i].choices[0].text, `request ${i} differs from its run alone`);
  }
  let m = await metrics(srv.baseURL);
  for (let i = 0; i < 100 && m['gptoss:num_requests_running'] > 0; i++) {
    await sleep(20);
    m = await metrics(srv.baseURL);
  }
  assert.ok(m['gptoss:num_preemptions_total'] > 0, 'the cache was exhausted');
  assert.equal(m['gptoss:request_finished_total'] - m0['gptoss:request_finished_total'], N, 'none lost');
  assert.equal(m['gptoss:kv_cache_pages_used_full'], 0, 'KV pages returned');
  // the engine's per-step timing is exported
  assert.ok(m['gptoss:step_forward_seconds_count'] > 0);
  assert.ok(m['gptoss:step_host_seconds_count'] > 0);
});
