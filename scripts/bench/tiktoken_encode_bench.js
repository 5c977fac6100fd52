// Encode throughput of the reference tokenizer (npm `tiktoken`, o200k_harmony table as in
// ../shared/tools/o200k-oracle) on one text file, one thread.
//   NODE_PATH=~/.cache/o200k-oracle/node_modules node tiktoken_encode_bench.js FILE [SECONDS]
const fs = require("fs");
const { Tiktoken } = require("tiktoken/lite");
const o200k = require("tiktoken/encoders/o200k_base.json");
const special = {};
for (let i = 200013; i < 201088; i++) special[`<|reserved_${i}|>`] = i;
Object.assign(special, { "<|endoftext|>": 199999, "<|return|>": 200002, "<|start|>": 200006 });
const enc = new Tiktoken(o200k.bpe_ranks, special, o200k.pat_str);
const text = fs.readFileSync(process.argv[2], "utf8");
const bytes = Buffer.byteLength(text, "utf8");
const seconds = Number(process.argv[3] || 3);
let tokens = enc.encode(text, "all").length;  // warm-up
let n = 0;
const t0 = process.hrtime.bigint();
let el = 0;
do {
  tokens = enc.encode(text, "all").length;
  n++;
  el = Number(process.hrtime.bigint() - t0) / 1e9;
} while (el < seconds);
console.log(`text: ${bytes} bytes, ${tokens} tokens; ${n} passes in ${el.toFixed(2)} s: ${(bytes * n / el / 1e6).toFixed(2)} MB/s`);
enc.free();
