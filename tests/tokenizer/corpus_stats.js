// Counts what a tokenizer conformance corpus exercises: lines per script (a line counts for
// every script it contains), code lines, and the whitespace shapes that break pre-tokenizers.
// Lines are split on '\n' only, as reference_ids.js does.
// Usage: node tests/tokenizer/corpus_stats.js CORPUS
'use strict';
const fs = require('fs');

const path = process.argv[2];
if (!path) {
  console.error('usage: node corpus_stats.js CORPUS');
  process.exit(2);
}
const text = fs.readFileSync(path, 'utf8');
const lines = text.split('\n');
if (lines.length && lines[lines.length - 1] === '') lines.pop();

const classes = {
  cjk: /[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}]/u,
  arabic: /\p{Script=Arabic}/u,
  cyrillic: /\p{Script=Cyrillic}/u,
  emoji: /\p{Extended_Pictographic}/u,
  // C++ and Go lines: a statement end, a brace, or a declaration keyword.
  code: /(;\s*$|[{}]\s*$|^\s*(#include|#define|template|namespace|func|package|import|return)\b)/,
  spaces_run: / {2,}/,
  tab: /\t/,
  control: /[\x00-\x08\x0b-\x1f\x7f]/,
};
const counts = Object.fromEntries(Object.keys(classes).map(k => [k, 0]));
let blank = 0, blankRuns = 0, prevBlank = false, maxLen = 0;
for (const line of lines) {
  for (const [k, re] of Object.entries(classes)) if (re.test(line)) counts[k]++;
  const isBlank = line.trim() === '';
  if (isBlank) { blank++; if (prevBlank) blankRuns++; }
  prevBlank = isBlank;
  maxLen = Math.max(maxLen, Buffer.byteLength(line));
}
console.log(`corpus ${path}: ${lines.length} lines, ${Buffer.byteLength(text)} bytes, longest line ${maxLen} bytes`);
console.log(Object.entries(counts).map(([k, v]) => `${k}=${v}`).join(' ') +
            ` blank=${blank} blank_after_blank=${blankRuns}`);
