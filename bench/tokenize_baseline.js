// Baseline for bench/tokenize.cpp: Hugging Face's Rust tokenizers through its Node binding
// (npm `tokenizers`), encodeBatch over the same lines, the same rounds, ids materialised.
// Threads: the Rust side uses rayon; RAYON_NUM_THREADS sets the pool (run_tokenize.sh sets it).
//
//   node bench/tokenize_baseline.js TOKENIZER_JSON CORPUS REPEAT ROUNDS THREADS
// Prints: RESULT impl=hf threads=N lines=L bytes=B tokens=T cold_s=X warm_s=Y warm_mb_s=Z
//         binding_overhead_s=O
'use strict';
const fs = require('fs');
const path = require('path');

async function main() {
  const [file, corpus, repeatArg, roundsArg, threadsArg] = process.argv.slice(2);
  if (!threadsArg) {
    console.error('usage: node tokenize_baseline.js TOKENIZER_JSON CORPUS REPEAT ROUNDS THREADS');
    process.exit(2);
  }
  const modules = process.env.TOKENIZER_NODE_MODULES ||
                  path.join(__dirname, '..', 'build', 'test_assets', 'node_modules');
  const tk = require(path.join(modules, 'tokenizers'));
  const tok = tk.Tokenizer.fromFile(file);
  const base = fs.readFileSync(corpus, 'utf8').split('\n');
  if (base.length && base[base.length - 1] === '') base.pop();
  const lines = [];
  let bytes = 0;
  for (let r = 0; r < Number(repeatArg); r++) {
    for (const l of base) {
      lines.push(l);
      bytes += Buffer.byteLength(l, 'utf8');
    }
  }
  // One call per round, like encode_batch on our side: the binding splits it over rayon.
  let cold = 0, warm = Infinity, tokens = 0;
  for (let r = 0; r < Number(roundsArg); r++) {
    const t0 = process.hrtime.bigint();
    const enc = await tok.encodeBatch(lines, { addSpecialTokens: true });
    tokens = 0;
    for (const e of enc) tokens += e.getIds().length;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    if (r === 0) cold = s; else warm = Math.min(warm, s);
  }
  // The binding's own cost per line (JS strings in, Encoding objects out, getIds): the same
  // number of one-character lines. warm_s minus this is an upper bound on the Rust work.
  const tiny = new Array(lines.length).fill('a');
  let overhead = Infinity;
  for (let r = 0; r < 3; r++) {
    const t0 = process.hrtime.bigint();
    const enc = await tok.encodeBatch(tiny, { addSpecialTokens: true });
    for (const e of enc) e.getIds();
    overhead = Math.min(overhead, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  console.log(`RESULT impl=hf threads=${threadsArg} lines=${lines.length} bytes=${bytes} tokens=${tokens} ` +
              `cold_s=${cold.toFixed(4)} warm_s=${warm.toFixed(4)} warm_mb_s=${(bytes / 1e6 / warm).toFixed(2)} ` +
              `binding_overhead_s=${overhead.toFixed(4)}`);
}

main().catch(e => { console.error(`tokenize_baseline: ${e.stack || e}`); process.exit(1); });
