// Reference token ids from Hugging Face's Rust tokenizers (npm `tokenizers`, a native binding)
// for every line of a corpus. Our C++ tokenizer must reproduce these ids exactly.
//
//   node tests/tokenizer/reference_ids.js [--decode] TOKENIZER_JSON CORPUS OUT_JSONL
//   node tests/tokenizer/reference_ids.js [--decode] --gpt2 VOCAB_JSON MERGES_TXT CORPUS OUT_JSONL
//   node tests/tokenizer/reference_ids.js [--decode] --bert VOCAB_TXT CORPUS OUT_JSONL
//
// Lines: CORPUS is read as strict UTF-8 (invalid bytes are an error, a BOM is kept) and split
// on '\n' only; '\r', tabs and other whitespace stay in the line. A final '\n' ends the last
// line rather than starting an empty one. Line numbers count from 0.
// Output: one JSON object per line, {"line": i, "ids": [...], "ids_special": [...]}, ids
// without and with add_special_tokens; --decode adds "decoded", decode(ids) keeping specials.
// The binding is found in $TOKENIZER_NODE_MODULES, else in the nearest node_modules above
// the tokenizer file, else in build/test_assets/node_modules of this repository.
'use strict';
const fs = require('fs');
const path = require('path');

const BATCH = 1024; // lines per encodeBatch call; the binding spreads a batch over its threads

function die(msg) {
  console.error(`reference_ids: ${msg}`);
  process.exit(1);
}

function usage() {
  console.error('usage: node reference_ids.js [--decode] TOKENIZER_JSON CORPUS OUT_JSONL\n' +
                '       node reference_ids.js [--decode] --gpt2 VOCAB_JSON MERGES_TXT CORPUS OUT_JSONL\n' +
                '       node reference_ids.js [--decode] --bert VOCAB_TXT CORPUS OUT_JSONL');
  process.exit(2);
}

function findBinding(nearFile) {
  const candidates = [];
  if (process.env.TOKENIZER_NODE_MODULES) candidates.push(process.env.TOKENIZER_NODE_MODULES);
  for (let d = path.dirname(path.resolve(nearFile)); ; d = path.dirname(d)) {
    candidates.push(path.join(d, 'node_modules'));
    if (path.basename(d) === 'node_modules') candidates.push(d);
    if (path.dirname(d) === d) break;
  }
  candidates.push(path.join(__dirname, '..', '..', 'build', 'test_assets', 'node_modules'));
  for (const dir of candidates) {
    const p = path.join(dir, 'tokenizers');
    if (fs.existsSync(path.join(p, 'package.json'))) return require(p);
  }
  die(`npm package tokenizers not found (looked in ${candidates.join(', ')}); ` +
        'run tests/tokenizer/fetch_assets.sh or set TOKENIZER_NODE_MODULES');
}

function readLines(file) {
  const bytes = fs.readFileSync(file);
  let text;
  try {
    text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
  } catch (e) {
    die(`${file} is not valid UTF-8`);
  }
  const lines = text.split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  return lines;
}

// GPT2TokenizerFast from vocab.json + merges.txt, as transformers' GPT2Converter builds it:
// byte-level BPE without prefix space, ByteLevel post-processor that adds nothing (GPT-2 has
// add_bos_token false), ByteLevel decoder, and <|endoftext|> as the special token. The files
// are parsed by the binding's own BPE.fromFile (it skips the "#version" header of merges);
// the binding has no ByteLevel decoder constructor, so the tokenizer goes through its JSON
// form once to gain one.
async function gpt2Tokenizer(tk, vocabJson, mergesTxt) {
  const model = await tk.BPE.fromFile(vocabJson, mergesTxt, {
    continuingSubwordPrefix: '', endOfWordSuffix: '', fuseUnk: false,
  });
  const built = new tk.Tokenizer(model);
  built.setPreTokenizer(tk.byteLevelPreTokenizer(false, true));
  built.setPostProcessor(tk.byteLevelProcessing(false));
  built.addSpecialTokens(['<|endoftext|>']);
  const tmp = path.join(require('os').tmpdir(), `reference_ids_gpt2_${process.pid}.json`);
  built.save(tmp);
  const json = JSON.parse(fs.readFileSync(tmp, 'utf8'));
  fs.unlinkSync(tmp);
  json.decoder = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true };
  return tk.Tokenizer.fromString(JSON.stringify(json));
}

// BertTokenizerFast (bert-base-uncased) from vocab.txt, built from the binding's own parts:
// WordPiece.fromFile parses the file, BertNormalizer (lowercase, accents stripped),
// BertPreTokenizer, [CLS] $A [SEP], WordPiece decoder, the five special tokens.
async function bertTokenizer(tk, vocabTxt) {
  const model = await tk.WordPiece.fromFile(vocabTxt, {
    unkToken: '[UNK]', continuingSubwordPrefix: '##', maxInputCharsPerWord: 100,
  });
  const built = new tk.Tokenizer(model);
  built.setNormalizer(tk.bertNormalizer({ cleanText: true, handleChineseChars: true, lowercase: true }));
  built.setPreTokenizer(tk.bertPreTokenizer());
  const id = (t) => { const v = built.tokenToId(t); if (v == null) die(`${vocabTxt} has no ${t}`); return v; };
  built.setPostProcessor(tk.bertProcessing(['[SEP]', id('[SEP]')], ['[CLS]', id('[CLS]')]));
  built.setDecoder(tk.wordPieceDecoder('##', true));
  built.addSpecialTokens(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']);
  return built;
}

async function main() {
  const args = process.argv.slice(2);
  const decode = args[0] === '--decode';
  if (decode) args.shift();
  let tk, tok, corpus, out;
  if (args[0] === '--gpt2') {
    if (args.length !== 5) usage();
    const [, vocab, merges] = args;
    [corpus, out] = args.slice(3);
    tk = findBinding(vocab);
    tok = await gpt2Tokenizer(tk, vocab, merges);
  } else if (args[0] === '--bert') {
    if (args.length !== 4) usage();
    const vocab = args[1];
    [corpus, out] = args.slice(2);
    tk = findBinding(vocab);
    tok = await bertTokenizer(tk, vocab);
  } else {
    if (args.length !== 3) usage();
    let file;
    [file, corpus, out] = args;
    tk = findBinding(file);
    try {
      tok = tk.Tokenizer.fromFile(file);
    } catch (e) {
      die(`cannot load ${file}: ${e.message}`);
    }
  }

  const lines = readLines(corpus);
  const fd = fs.openSync(out, 'w');
  for (let start = 0; start < lines.length; start += BATCH) {
    const batch = lines.slice(start, start + BATCH);
    const [plain, special] = await Promise.all([
      tok.encodeBatch(batch, { addSpecialTokens: false }),
      tok.encodeBatch(batch, { addSpecialTokens: true }),
    ]);
    const ids = plain.map(e => e.getIds());
    const decoded = decode ? await tok.decodeBatch(ids, false) : null;
    let chunk = '';
    for (let i = 0; i < batch.length; i++) {
      const rec = { line: start + i, ids: ids[i], ids_special: special[i].getIds() };
      if (decode) rec.decoded = decoded[i];
      chunk += JSON.stringify(rec) + '\n';
    }
    fs.writeSync(fd, chunk);
  }
  fs.closeSync(fd);
}

main().catch(e => { console.error(`reference_ids: ${e.stack || e}`); process.exit(1); });
