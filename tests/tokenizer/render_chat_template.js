// Reference for chat templates: renders a Jinja chat_template with @huggingface/jinja (the
// engine transformers.js's apply_chat_template uses) and encodes the text with HF `tokenizers`
// (add_special_tokens false, as apply_chat_template(tokenize=true) does).
//
// Usage: node render_chat_template.js CASES_JSON OUT_JSONL
// CASES_JSON: {"template": "...", "tokenizer": "path/tokenizer.json",
//              "bos_token": "...", "eos_token": "...",
//              "cases": [{"messages": [{"role", "content": string or [{"type": "text"|"image"|"video", "text"}]}],
//                         "add_generation_prompt": false,
//                         "image_pad_counts": [n, ...], "video_pad_counts": [n, ...]}]}
// Each rendered `<|image_pad|>` / `<|video_pad|>` is then repeated n times, in order, as
// Qwen2VLProcessor does with the image processor's token counts (default 1).
// OUT_JSONL: one {"case": i, "text": "...", "ids": [...]} per case.
"use strict";
const fs = require("fs");
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

async function main() {
  const [casesPath, outPath] = process.argv.slice(2);
  if (!casesPath || !outPath) {
    console.error("usage: node render_chat_template.js CASES_JSON OUT_JSONL");
    process.exit(1);
  }
  const spec = JSON.parse(fs.readFileSync(casesPath, "utf8"));
  const modules = findModules(spec.tokenizer);
  const { Template } = require(path.join(modules, "@huggingface/jinja"));
  const { Tokenizer } = require(path.join(modules, "tokenizers"));
  const template = new Template(spec.template);
  const tok = Tokenizer.fromFile(spec.tokenizer);
  const out = [];
  for (let i = 0; i < spec.cases.length; i++) {
    const c = spec.cases[i];
    let text = template.render({
      messages: c.messages,
      add_generation_prompt: !!c.add_generation_prompt,
      bos_token: spec.bos_token || "",
      eos_token: spec.eos_token || "",
    });
    text = expandPads(text, "<|image_pad|>", c.image_pad_counts);
    text = expandPads(text, "<|video_pad|>", c.video_pad_counts);
    const [enc] = await tok.encodeBatch([text], { addSpecialTokens: false });
    out.push(JSON.stringify({ case: i, text, ids: Array.from(enc.getIds()) }));
  }
  fs.writeFileSync(outPath, out.join("\n") + "\n");
}

main().catch((e) => { console.error("render_chat_template: " + (e && e.stack || e)); process.exit(1); });
