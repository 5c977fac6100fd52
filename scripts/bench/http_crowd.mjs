#!/usr/bin/env node
// The HTTP crowd scenario of tests/e2e/crowd.test.mjs as a benchmark: prints its figures for
// any `gptoss serve` binary (e.g. an older build, to compare), asserting nothing.
//   node scripts/bench/http_crowd.mjs --bin build/gptoss [--idle 2000] [--slow 300] [--streams 32]
//        [--max-tokens 16] [--json out.json] [-- extra serve flags]
import { writeFileSync } from 'node:fs';
import { resolve } from 'node:path';

const argv = process.argv.slice(2);
const opt = { bin: 'build/gptoss', idle: 2000, slow: 300, streams: 32, 'max-tokens': 16, json: '' };
const extra = [];
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--') { extra.push(...argv.slice(i + 1)); break; }
  const k = argv[i].replace(/^--/, '');
  if (!(k in opt)) { console.error(`unknown option ${argv[i]}`); process.exit(2); }
  opt[k] = typeof opt[k] === 'number' ? Number(argv[++i]) : argv[++i];
}
process.env.GPTOSS_BIN = resolve(opt.bin);
const { startServer } = await import('../../tests/e2e/harness.mjs');
const { crowdScenario } = await import('../../tests/e2e/crowd.mjs');

const srv = await startServer(['--max-num-seqs', String(opt.streams), ...extra]);
let r;
try {
  r = await crowdScenario(srv, { idle: opt.idle, slow: opt.slow, streams: opt.streams, maxTokens: opt['max-tokens'],
                                 healthTimeoutMs: 30000, streamTimeoutMs: 90000 });
} finally {
  srv.proc.kill('SIGKILL');
}
const summary = {
  bin: opt.bin, idle: r.idle, slow: r.slow, streams: r.streams,
  health_alone_ms: r.healthAlone.ms, health_probes: r.healthSamples.length, health_answered: r.healthAnswered,
  health_median_ms: r.healthMedianMs, health_max_ms: r.healthMaxMs,
  streams_complete: r.streamsComplete, same_tokens: r.sameTokens,
  threads_before: r.threadsBefore, threads_min: Math.min(...r.threadSamples), threads_max: Math.max(...r.threadSamples),
  rss_per_idle_connection_bytes: Math.round(r.rssPerIdleConnBytes), idle_closed_by_server: r.idleClosedDuring,
  slowloris_closed_by_server: r.slowClosedDuring, seconds: r.seconds,
};
console.log(JSON.stringify(summary, null, 1));
if (opt.json) writeFileSync(opt.json, JSON.stringify(summary, null, 1) + '\n');
process.exit(0);
