// js-tiktoken@1.0.21 (gpt2) encode throughput on the same text, best of N
// passes after one warm-up, as one JSON line. Run by scripts/bench tokenizer.
const fs = require("fs");
const [, , tiktokenPath, textPath, passesArg] = process.argv;
const { getEncoding } = require(tiktokenPath);
const text = fs.readFileSync(textPath, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
const enc = getEncoding("gpt2");
enc.encode(text, [], []);
let best = Infinity, n = 0;
for (let p = 0; p < Number(passesArg || 5); p++) {
  const t0 = process.hrtime.bigint();
  n = enc.encode(text, [], []).length;
  best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
}
console.log(JSON.stringify({ impl: "js-tiktoken", cache: "warm", bytes, tokens: n,
                             seconds: best, MB_per_s: bytes / best / 1e6 }));
