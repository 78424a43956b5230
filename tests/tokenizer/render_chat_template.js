// Reference for chat templates: Hugging Face's transformers.js (@huggingface/transformers)
// loads a local model directory offline (tokenizer.json + tokenizer_config.json whose
// "chat_template" is the template under test) and renders each conversation with
// tokenizer.apply_chat_template. The rendered text's <|image_pad|> / <|video_pad|> are then
// repeated n times, as Qwen2VLProcessor does with the image processor's token counts, and the
// text is encoded with add_special_tokens=false, as apply_chat_template(tokenize=true) does.
// The ids are computed twice, by transformers.js's tokenizer and by the Rust `tokenizers`
// library, and must agree (and, without pads, equal apply_chat_template(tokenize=true)).
//
// Usage: node render_chat_template.js CASES_JSON OUT_JSONL
// CASES_JSON: {"template": "...", "tokenizer": "path/tokenizer.json",
//              "bos_token": "...", "eos_token": "...",
//              "cases": [{"messages": [{"role", "content": string or [{"type": "text"|"image"|"video", "text"}]}],
//                         "add_generation_prompt": false,
//                         "image_pad_counts": [n, ...], "video_pad_counts": [n, ...]}]}
// OUT_JSONL: one {"case": i, "text": "...", "ids": [...]} per case.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");

function findModules(from) {
  if (process.env.TOKENIZER_NODE_MODULES) return process.env.TOKENIZER_NODE_MODULES;
  for (let d = path.resolve(from); d !== path.dirname(d); d = path.dirname(d)) {
    if (path.basename(d) === "node_modules") return d;
  }
  return path.resolve(__dirname, "../../build/test_assets/node_modules");
}

function expandPads(text, token, counts) {
  if (!counts) return text;
  let i = 0;
  return text.split(token).reduce((acc, part, k) => {
    if (k === 0) return part;
    const n = i < counts.length ? counts[i] : 1;
    i++;
    return acc + token.repeat(n) + part;
  }, "");
}

function same(a, b) {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

async function main() {
  const [casesPath, outPath] = process.argv.slice(2);
  if (!casesPath || !outPath) {
    console.error("usage: node render_chat_template.js CASES_JSON OUT_JSONL");
    process.exit(1);
  }
  const spec = JSON.parse(fs.readFileSync(casesPath, "utf8"));
  const modules = findModules(spec.tokenizer);
  const { env, AutoTokenizer } = require(path.join(modules, "@huggingface/transformers"));
  const rust = require(path.join(modules, "tokenizers")).Tokenizer.fromFile(spec.tokenizer);

  // A model directory for transformers.js: the tokenizer.json and a tokenizer_config.json that
  // carries the template under test and the special tokens it refers to.
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "render_chat_template_"));
  const modelDir = path.join(root, "model");
  fs.mkdirSync(modelDir);
  fs.copyFileSync(spec.tokenizer, path.join(modelDir, "tokenizer.json"));
  fs.writeFileSync(path.join(modelDir, "tokenizer_config.json"), JSON.stringify({
    chat_template: spec.template,
    bos_token: spec.bos_token || null,
    eos_token: spec.eos_token || null,
    tokenizer_class: "PreTrainedTokenizerFast",
  }));
  env.allowRemoteModels = false;
  env.allowLocalModels = true;
  env.localModelPath = root;
  env.useBrowserCache = false;
  const tok = await AutoTokenizer.from_pretrained("model");

  const out = [];
  for (let i = 0; i < spec.cases.length; i++) {
    const c = spec.cases[i];
    const options = { add_generation_prompt: !!c.add_generation_prompt };
    let text = tok.apply_chat_template(c.messages, { ...options, tokenize: false });
    const expanded = expandPads(expandPads(text, "<|image_pad|>", c.image_pad_counts), "<|video_pad|>", c.video_pad_counts);
    const jsIds = Array.from(tok.encode(expanded, { add_special_tokens: false }));
    const [enc] = await rust.encodeBatch([expanded], { addSpecialTokens: false });
    const rustIds = Array.from(enc.getIds());
    if (!same(jsIds, rustIds)) throw new Error(`case ${i}: transformers.js and Rust tokenizers disagree on ${JSON.stringify(expanded)}`);
    if (expanded === text) {
      const r = tok.apply_chat_template(c.messages, { ...options, tokenize: true, return_tensor: false });
      const direct = Array.from(Array.isArray(r) ? r : r.input_ids);  // 4.x returns {input_ids, attention_mask}
      if (!same(direct, jsIds)) throw new Error(`case ${i}: apply_chat_template(tokenize=true) differs from encode(text)`);
    }
    out.push(JSON.stringify({ case: i, text: expanded, ids: jsIds }));
  }
  fs.rmSync(root, { recursive: true, force: true });
  fs.writeFileSync(outPath, out.join("\n") + "\n");
}

main().catch((e) => { console.error("render_chat_template: " + (e && e.stack || e)); process.exit(1); });
