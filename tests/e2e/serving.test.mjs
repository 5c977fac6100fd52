// `gptoss serve` on the real CPU backend (built-in tiny model) in configurations the other
// tests do not reach: a KV cache so small that requests are preempted and recomputed, an fp8
// KV cache, and presence/frequency penalties checked token by token.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, metrics } from './harness.mjs';

let ref;  // default options: the reference answers

before(async () => {
  ref = await startServer(['--max-num-seqs', '4', '--max-model-len', '256']);
});

after(async () => {
  assert.equal((await ref.stop()).code, 0);
});

async function post(srv, path, body) {
  const r = await fetch(`${srv.apiURL}${path}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  const json = await r.json();
  assert.equal(r.status, 200, JSON.stringify(json));
  return json;
}

// Four prompts of 10 token ids; each request generates 30 tokens (40 positions, 3 pages of 16).
const prompts = [0, 1, 2, 3].map((i) => Array.from({ length: 10 }, (_, j) => 1000 + 37 * i + 5 * j));
const requests = prompts.map((prompt, i) => ({
  prompt, max_tokens: 30, ignore_eos: true, logprobs: 0,
  ...(i === 3 ? { temperature: 1.0, seed: 99 } : { temperature: 0 }),  // one seeded sampled request
}));
const ids = (r) => r.choices[0].logprobs.tokens;

test('preemption and recompute on the CPU backend give the same tokens', async () => {
  // 64 KV positions = 4 pages: two requests fit at first; growing to 3 pages each, one of them
  // must be preempted (pages freed), then recomputed from its prompt and output so far.
  const small = await startServer(['--max-num-seqs', '4', '--max-model-len', '64', '--kv-cache-tokens', '64']);
  try {
    const alone = [];
    for (const r of requests) alone.push(await post(ref, '/completions', r));
    const crowded = await Promise.all(requests.map((r) => post(small, '/completions', r)));
    const m = await metrics(small.baseURL);
    assert.ok(m['gptoss:num_preemptions_total'] > 0, `no preemption happened: ${JSON.stringify(m)}`);
    for (let i = 0; i < requests.length; i++) {
      assert.equal(crowded[i].usage.completion_tokens, 30);
      assert.deepEqual(ids(crowded[i]), ids(alone[i]), `request ${i}`);
      assert.equal(crowded[i].choices[0].text, alone[i].choices[0].text, `request ${i}`);
    }
    // Each prompt token counts once in prompt_tokens_total, recomputes or not.
    assert.equal(m['gptoss:prompt_tokens_total'], prompts.reduce((a, p) => a + p.length, 0));
    assert.equal(m['gptoss:generation_tokens_total'], 4 * 30);
    assert.equal(m['gptoss:request_finished_total'], 4);
  } finally {
    assert.equal((await small.stop()).code, 0);
  }
});

test('an fp8 KV cache serves, close to the exact cache but rounded', async () => {
  const fp8 = await startServer(['--max-num-seqs', '4', '--max-model-len', '256', '--kv-cache-dtype', 'fp8']);
  try {
    const body = { prompt: prompts[0], max_tokens: 1, temperature: 0, logprobs: 5 };
    const a = await post(ref, '/completions', body);
    const b = await post(fp8, '/completions', body);
    const ta = a.choices[0].logprobs.top_logprobs[0];
    const tb = b.choices[0].logprobs.top_logprobs[0];
    let maxDiff = 0;
    let common = 0;
    for (const [tok, lp] of Object.entries(ta)) {
      if (!(tok in tb)) continue;
      common++;
      maxDiff = Math.max(maxDiff, Math.abs(lp - tb[tok]));
    }
    console.log(`fp8 KV cache: largest logprob change in the top 5: ${maxDiff}`);
    assert.ok(common >= 3, `the top-5 sets barely overlap: ${JSON.stringify(ta)} vs ${JSON.stringify(tb)}`);
    // fp8 e4m3 keeps 3 mantissa bits of every K and V: the answers must differ (the rounding is
    // applied), but only a little. Measured: 2.1e-4 (2026-11-30, built-in model, whose logits are
    // nearly flat); 1e-2 leaves room for other libm/compilers while a cache read back wrongly
    // (wrong dtype, wrong scale) scrambles attention and moves these logprobs by far more.
    assert.ok(maxDiff > 0, 'fp8 rounding was not applied');
    assert.ok(maxDiff < 1e-2, `fp8 moved a logprob by ${maxDiff}`);
    // and a longer generation works end to end
    const long = await post(fp8, '/completions', { prompt: prompts[1], max_tokens: 40, ignore_eos: true });
    assert.equal(long.usage.completion_tokens, 40);
  } finally {
    assert.equal((await fp8.stop()).code, 0);
  }
});

// With penalties, each greedy token must be the best candidate after subtracting
// presence * [seen] + frequency * count from its raw logprob (the API's logprobs are the raw
// distribution's; OpenAI's definition). The built-in random model never repeats a token by
// itself, so negative penalties make repeats attractive, and a positive frequency penalty on
// top makes them fade after a few: the formula is checked in both directions, count by count.
// The top-8 raw candidates stand for the rest: a token outside them has a lower raw logprob
// and, unless already generated (then it is scored as the chosen one is), no penalty.
test('presence and frequency penalties change greedy choices as OpenAI defines them', async () => {
  const messages = [{ role: 'user', content: 'Say something.' }];
  const base = { messages, max_tokens: 32, temperature: 0, logprobs: true, top_logprobs: 8 };
  const plain = await post(ref, '/chat/completions', base);
  for (const [presence, frequency] of [[-2, 0], [0, -1], [-1, 0.3]]) {
    const r = await post(ref, '/chat/completions', { ...base, presence_penalty: presence, frequency_penalty: frequency });
    const steps = r.choices[0].logprobs.content;
    assert.equal(steps.length, 32);
    const counts = new Map();
    const key = (e) => JSON.stringify(e.bytes);
    const penalty = (e) => (counts.has(key(e)) ? presence + frequency * counts.get(key(e)) : 0);
    let overturned = 0;
    for (const s of steps) {
      const best = Math.max(...s.top_logprobs.map((e) => e.logprob - penalty(e)));
      assert.ok(s.logprob - penalty(s) >= best - 1e-4,
        `presence ${presence} frequency ${frequency}: chose ${s.token} (${s.logprob - penalty(s)}) over a candidate at ${best}`);
      if (key(s) !== key(s.top_logprobs[0])) overturned++;
      counts.set(key(s), (counts.get(key(s)) || 0) + 1);
    }
    // Not vacuous: the penalties overturned the raw argmax, and tokens repeat.
    assert.ok(overturned > 0, `presence ${presence} frequency ${frequency} never changed a choice`);
    assert.ok(counts.size < steps.length, 'no token repeated');
    assert.notDeepEqual(steps.map((e) => e.token), plain.choices[0].logprobs.content.map((e) => e.token));
  }
});
