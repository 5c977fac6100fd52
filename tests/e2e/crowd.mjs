// A crowd of clients, as a load balancer or the internet brings them: many idle keep-alive
// connections, slowloris clients that send a header byte now and then, while real streams
// generate. Shared by crowd.test.mjs (asserts) and scripts/bench/http_crowd.mjs (prints the
// same figures for any `gptoss serve`, the old one included).
import net from 'node:net';
import http from 'node:http';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';

// Threads and resident memory of a process, from /proc/PID/status.
export function procStatus(pid) {
  const s = readFileSync(`/proc/${pid}/status`, 'utf8');
  const num = (k) => Number((s.match(new RegExp(`^${k}:\\s+(\\d+)`, 'm')) || [])[1]);
  return { threads: num('Threads'), rssKiB: num('VmRSS') };
}

// Opens n TCP connections that never send anything; resolves once all are connected.
export async function openIdle(port, n) {
  const socks = [];
  let failed = 0;
  let closed = 0;
  const batch = 200;  // connect in batches so the listen backlog is not the bottleneck
  for (let i = 0; i < n; i += batch) {
    await Promise.all(Array.from({ length: Math.min(batch, n - i) }, () => new Promise((resolve) => {
      const s = net.connect({ port, host: '127.0.0.1' });
      s.on('connect', resolve);
      s.on('error', () => { failed++; resolve(); });
      s.on('close', () => { closed++; });
      s.on('data', () => {});
      socks.push(s);
    })));
  }
  return { socks, failed: () => failed, closed: () => closed, destroy: () => socks.forEach((s) => s.destroy()) };
}

// n clients that start a request and then send one more header byte every intervalMs.
export function startSlowloris(port, n, intervalMs) {
  const socks = [];
  let closed = 0;
  let answered = 0;
  for (let i = 0; i < n; i++) {
    const s = net.connect({ port, host: '127.0.0.1' });
    s.on('connect', () => s.write('GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: '));
    s.on('error', () => {});
    s.on('close', () => { closed++; });
    s.on('data', () => { answered++; });
    socks.push(s);
  }
  const timer = setInterval(() => {
    for (const s of socks) if (!s.destroyed && s.writable) s.write('a');
  }, intervalMs);
  return {
    closed: () => closed,
    answered: () => answered,
    stop() { clearInterval(timer); socks.forEach((s) => s.destroy()); },
  };
}

// GET /health on a fresh connection: {ms, status}, or {ms: null} after timeoutMs.
export function timedHealth(port, timeoutMs) {
  return new Promise((resolve) => {
    const t0 = process.hrtime.bigint();
    const ms = () => Number(process.hrtime.bigint() - t0) / 1e6;
    const req = http.get({ host: '127.0.0.1', port, path: '/health', agent: false, timeout: timeoutMs }, (res) => {
      res.resume();
      res.on('end', () => resolve({ ms: ms(), status: res.statusCode }));
    });
    req.on('timeout', () => { req.destroy(); resolve({ ms: null, status: 0 }); });
    req.on('error', () => resolve({ ms: null, status: 0 }));
  });
}

// One greedy streamed chat request: its tokens (bytes of each, from logprobs) and finish reason.
export async function streamTokens(baseURL, i, maxTokens, timeoutMs = 120000) {
  const body = {
    model: 'gpt-oss-tiny', messages: [{ role: 'user', content: `Request ${i}: say something about ${i * 7 + 3}.` }],
    max_tokens: maxTokens, temperature: 0, logprobs: true, stream: true, ignore_eos: true,
  };
  const r = await fetch(`${baseURL}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await r.text();
  const toks = [];
  let finish = null;
  let done = false;
  for (const ev of text.split('\n\n')) {
    if (!ev.startsWith('data: ')) continue;
    if (ev === 'data: [DONE]') { done = true; continue; }
    const j = JSON.parse(ev.slice(6));
    if (!j.choices?.length) continue;
    for (const l of j.choices[0].logprobs?.content ?? []) toks.push(l.bytes.join(','));
    if (j.choices[0].finish_reason) finish = j.choices[0].finish_reason;
  }
  return { status: r.status, toks, finish, done };
}

// One streamed completion of a short prompt of token ids: {status, chunks (text chunks), finish, done}.
export async function streamCompletion(baseURL, i, maxTokens, timeoutMs = 120000) {
  const body = { model: 'gpt-oss-tiny', prompt: [1 + (i % 100), 2, 3], max_tokens: maxTokens, temperature: 0,
                 stream: true, ignore_eos: true, stream_options: { include_usage: true } };
  const r = await fetch(`${baseURL}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await r.text();
  let finish = null;
  let done = false;
  let usage = null;
  for (const ev of text.split('\n\n')) {
    if (!ev.startsWith('data: ')) continue;
    if (ev === 'data: [DONE]') { done = true; continue; }
    const j = JSON.parse(ev.slice(6));
    if (j.usage) usage = j.usage;
    if (j.choices?.length && j.choices[0].finish_reason) finish = j.choices[0].finish_reason;
  }
  return { status: r.status, finish, done, usage };
}

// The whole scenario against a started server (harness.startServer). Returns the figures.
export async function crowdScenario(srv, { idle = 2000, slow = 300, streams = 32, maxTokens = 16,
                                           slowIntervalMs = 500, healthTimeoutMs = 30000, streamTimeoutMs = 120000,
                                           log = console.log } = {}) {
  const pid = srv.proc.pid;
  const out = { idle, slow, streams };
  const t0 = Date.now();
  const runStreams = () => Promise.all(Array.from({ length: streams }, (_, i) =>
    streamTokens(srv.baseURL, i, maxTokens, streamTimeoutMs).catch((e) => ({ error: String(e), toks: [] }))));

  out.alone = await runStreams();
  out.healthAlone = await timedHealth(srv.port, healthTimeoutMs);
  const before = procStatus(pid);
  out.threadsBefore = before.threads;
  log(`without the crowd: /health ${out.healthAlone.ms?.toFixed(1)} ms; ${before.threads} threads, RSS ${before.rssKiB} KiB`);

  const crowd = await openIdle(srv.port, idle);
  await sleep(1000);  // let the server accept them all
  const withIdle = procStatus(pid);
  out.rssPerIdleConnBytes = ((withIdle.rssKiB - before.rssKiB) * 1024) / idle;
  out.threadsWithIdle = withIdle.threads;
  log(`${idle} idle connections (${crowd.failed()} failed to connect, ${crowd.closed()} closed): RSS +${withIdle.rssKiB - before.rssKiB} KiB ` +
      `= ${out.rssPerIdleConnBytes.toFixed(0)} bytes each; ${withIdle.threads} threads`);
  const loris = startSlowloris(srv.port, slow, slowIntervalMs);
  await sleep(1000);

  // The streams, with /health probed on fresh connections and threads sampled meanwhile.
  const threadSamples = [];
  const healthSamples = [];
  let streaming = true;
  const sampler = (async () => {
    while (streaming) {
      threadSamples.push(procStatus(pid).threads);
      healthSamples.push(await timedHealth(srv.port, healthTimeoutMs));
      await sleep(100);
    }
  })();
  out.crowded = await runStreams();
  streaming = false;
  await sampler;
  const after = procStatus(pid);
  threadSamples.push(after.threads);
  out.threadSamples = threadSamples;
  out.healthSamples = healthSamples;
  const answered = healthSamples.filter((h) => h.ms !== null).map((h) => h.ms).sort((a, b) => a - b);
  out.healthAnswered = answered.length;
  out.healthMedianMs = answered.length ? answered[Math.floor(answered.length / 2)] : null;
  out.healthMaxMs = answered.length ? answered[answered.length - 1] : null;
  out.idleClosedDuring = crowd.closed();
  out.slowClosedDuring = loris.closed();
  out.slowAnswered = loris.answered();
  out.rssWithCrowdKiB = after.rssKiB;
  out.sameTokens = out.crowded.every((r, i) => JSON.stringify(r.toks) === JSON.stringify(out.alone[i].toks));
  out.streamsComplete = out.crowded.filter((r) => r.done && r.finish).length;
  log(`with ${idle} idle + ${slow} slowloris: /health answered ${answered.length}/${healthSamples.length} probes, ` +
      `median ${out.healthMedianMs?.toFixed(1)} ms, max ${out.healthMaxMs?.toFixed(1)} ms; ` +
      `${out.streamsComplete}/${streams} streams complete, same tokens as alone: ${out.sameTokens}; ` +
      `threads ${Math.min(...threadSamples)}..${Math.max(...threadSamples)} (before: ${before.threads}); ` +
      `crowd connections closed by the server meanwhile: ${out.idleClosedDuring} idle, ${out.slowClosedDuring} slow`);
  loris.stop();
  crowd.destroy();
  out.seconds = (Date.now() - t0) / 1000;
  return out;
}
