#!/usr/bin/env bash
# Generates the fuzz harnesses' seed corpora: make_seeds.sh MM SEEDS FUZZ_BUILD
#   MM          the main build's mm (trains, exports, converts the tiny checkpoint the seeds come from)
#   SEEDS       output folder: SEEDS/<harness>/ per harness, SEEDS/checkpoint/ a sharded fixture
#   FUZZ_BUILD  the fuzz build folder (its fuzz_record_index_cache writes its own seed)
# Everything is made here, small, from this project's tools and Debian's (ffmpeg, spm_train) on
# Debian's fortunes: no third-party file is committed or downloaded.
set -euo pipefail
MM=$1 SEEDS=$2 FB=$3
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || PY=python3
rm -rf "$SEEDS"
mkdir -p "$SEEDS"
W="$SEEDS/.work"
mkdir -p "$W"
seed() { mkdir -p "$SEEDS/$1"; cp "$2" "$SEEDS/$1/${3:-$(basename "$2")}"; }

# A tiny trained checkpoint, its export, and the same resplit into two FSDP shards (metadata.json).
cat > "$W/tiny.yaml" <<'EOF'
data:
  dataset: text
  paths: [/usr/share/games/fortunes]
  format: fortune
  seq_len: 16
model:
  id: qwen2
  config: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, max_position_embeddings: 32, tie_word_embeddings: true}
training:
  train_iters: 1
  micro_batch_size: 2
  optimizer: {id: adamw, lr: 1.0e-3}
  save_interval: 1
EOF
"$MM" train "$W/tiny.yaml" training.save_dir="$W/ck" >/dev/null
"$MM" export --checkpoint "$W/ck" --out "$W/hf" >/dev/null
"$MM" convert resplit --in "$W/ck" --out "$SEEDS/checkpoint" --dp 2 --quiet >/dev/null
seed fuzz_checkpoint_metadata "$SEEDS/checkpoint/metadata.json"
"$PY" - "$SEEDS/checkpoint/metadata.json" "$SEEDS/fuzz_checkpoint_metadata/compact.json" <<'EOF'
import json, sys
json.dump(json.load(open(sys.argv[1])), open(sys.argv[2], "w"), separators=(",", ":"))
EOF

# Safetensors: the checkpoint's weights, RNG state and optimizer state, the export.
for f in "$W/ck/iter_0000001/model.safetensors" "$W/ck/iter_0000001/rng.safetensors" "$W/hf/model.safetensors"; do
  seed fuzz_safetensors "$f" "$(basename "$(dirname "$f")")_$(basename "$f")"
  seed fuzz_safetensors_roundtrip "$f" "$(basename "$(dirname "$f")")_$(basename "$f")"
done

# Model configs: the export's config.json, a umT5 from mm init, and the model.config sections of
# the example configs (Qwen2-VL, Qwen2.5-VL, LLaVA, the Wan DiT and VAE) as config.json.
mkdir -p "$SEEDS/fuzz_model_config"
cp "$W/hf/config.json" "$SEEDS/fuzz_model_config/qwen2.json"
printf '{"cap": "a shoe moving left"}\n{"cap": "a bag moving up"}\n' > "$W/captions.jsonl"
"$MM" init tokenizer --captions "$W/captions.jsonl" --out "$W/tok" >/dev/null
"$MM" init text-encoder --tokenizer "$W/tok" --config '{"d_model": 16, "d_kv": 8, "d_ff": 32, "num_layers": 1, "num_heads": 2}' \
  --out "$W/te" >/dev/null
cp "$W/te/config.json" "$SEEDS/fuzz_model_config/umt5.json"
"$PY" - "$ROOT/examples" "$SEEDS/fuzz_model_config" <<'EOF'
import json, sys, yaml, pathlib
root, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for y in ["qwen2vl/tiny_fashion_mnist.yaml", "qwen2.5vl/tiny_fashion_mnist.yaml", "llava/tiny_fashion_mnist.yaml",
          "wan2.1/tiny_dit.yaml", "wan2.1/tiny_vae.yaml", "qwen2vl/qwen2vl_7b.yaml"]:
    m = yaml.safe_load(open(root / y))["model"]
    c = dict(m.get("config") or {})
    c.setdefault("model_type", m["id"])
    json.dump(c, open(out / (y.replace("/", "_").replace(".yaml", ".json")), "w"))
EOF

# Tokenizers: the caption Unigram from mm init, and hand-written BPE, WordPiece and WordLevel ones.
seed fuzz_tokenizer_json "$W/tok/tokenizer.json" unigram.json
cat > "$SEEDS/fuzz_tokenizer_json/bpe.json" <<'EOF'
{"version":"1.0","added_tokens":[{"id":8,"content":"<|im_start|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
 "normalizer":{"type":"NFC"},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]},
 "post_processor":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false},
 "decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false},
 "model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,
  "vocab":{"H":0,"e":1,"l":2,"o":3,"He":4,"ll":5,"Hell":6,"Hello":7},"merges":["H e","l l","He ll","Hell o"]}}
EOF
cat > "$SEEDS/fuzz_tokenizer_json/wordpiece.json" <<'EOF'
{"version":"1.0","added_tokens":[{"id":0,"content":"[UNK]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},{"id":1,"content":"[CLS]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},{"id":2,"content":"[SEP]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
 "normalizer":{"type":"BertNormalizer","clean_text":true,"handle_chinese_chars":true,"strip_accents":null,"lowercase":true},
 "pre_tokenizer":{"type":"BertPreTokenizer"},
 "post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"[CLS]","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"[SEP]","type_id":0}}],"pair":[{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],"special_tokens":{"[CLS]":{"id":"[CLS]","ids":[1],"tokens":["[CLS]"]},"[SEP]":{"id":"[SEP]","ids":[2],"tokens":["[SEP]"]}}},
 "decoder":{"type":"WordPiece","prefix":"##","cleanup":true},
 "model":{"type":"WordPiece","unk_token":"[UNK]","continuing_subword_prefix":"##","max_input_chars_per_word":100,"vocab":{"[UNK]":0,"[CLS]":1,"[SEP]":2,"hello":3,"world":4,"##s":5,"!":6}}}
EOF
cat > "$SEEDS/fuzz_tokenizer_json/wordlevel.json" <<'EOF'
{"version":"1.0","added_tokens":[],"normalizer":{"type":"Sequence","normalizers":[{"type":"Lowercase"},{"type":"Strip","strip_left":true,"strip_right":true},{"type":"Replace","pattern":{"String":"  "},"content":" "}]},
 "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":{"type":"Metaspace","replacement":"\u2581","prepend_scheme":"always","split":true},
 "model":{"type":"WordLevel","vocab":{"<unk>":0,"hello":1,"world":2},"unk_token":"<unk>"}}
EOF

# SentencePiece models trained by Debian's spm_train on a slice of fortunes.
head -c 60000 /usr/share/games/fortunes/fortunes > "$W/spm.txt"
mkdir -p "$SEEDS/fuzz_sentencepiece"
for t in unigram bpe char word; do
  # identity normalization: no 240 KB NFKC table, so a seed stays under the fuzzers' 64 KB inputs
  spm_train --input="$W/spm.txt" --model_prefix="$W/spm_$t" --vocab_size=$([ $t = bpe ] && echo 400 || echo 80) \
    --model_type=$t --hard_vocab_limit=false --byte_fallback=$([ $t = bpe ] && echo true || echo false) \
    --normalization_rule_name=identity --minloglevel=2 >/dev/null 2>&1
  cp "$W/spm_$t.model" "$SEEDS/fuzz_sentencepiece/$t.model"
done

# Chat conversations: flags byte (template, options), then role-byte + content parts split by 0x1e.
mkdir -p "$SEEDS/fuzz_chat_template"
for k in 0 1 2 3 4; do
  printf "\\x0$k\\x01<image>What is this?\\x1e\\x02A boot.\\x1e\\x01And <video> this?\\x1e\\x02A coat." \
    > "$SEEDS/fuzz_chat_template/vl_$k"
  printf "\\x$((k + 0x10))\\x00Be kind.\\x1e\\x01Hi\\x1e\\x02Hello!\\x1e\\x01Bye" > "$SEEDS/fuzz_chat_template/system_$k"
done

# YAML configs: this project's examples, and one with overrides after a NUL byte.
mkdir -p "$SEEDS/fuzz_config"
for y in "$ROOT"/examples/*/*.yaml; do cp "$y" "$SEEDS/fuzz_config/$(basename "$(dirname "$y")")_$(basename "$y")"; done
{ cat "$W/tiny.yaml"; printf '\0training.train_iters=5\nmodel.config.hidden_size=8\nparallel.tensor_parallel_size=2\n'; } \
  > "$SEEDS/fuzz_config/overrides.yaml"

# mllm records: JSONL in the default and ShareGPT spellings (first byte's low bit picks), a JSON
# array, and a LLaVA file.
mkdir -p "$SEEDS/fuzz_mllm_records"
cat > "$SEEDS/fuzz_mllm_records/default.jsonl" <<'EOF'
{"id":"a","messages":[{"role":"user","content":"<image>What is shown?"},{"role":"assistant","content":"Ankle boot"}],"images":["images/0.png"]}
{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"<video>And this?"},{"role":"assistant","content":"A coat"}],"videos":["v.mp4"],"answers":["coat","a coat"],"options":["coat","bag"]}
{"messages":[{"role":"user","content":"text only"},{"role":"assistant","content":"fine"}]}
EOF
printf '%s\n' '{"conversations":[{"from":"human","value":"<image>Hi"},{"from":"gpt","value":"Hello"}],"images":["x.jpg"]}' \
  > "$SEEDS/fuzz_mllm_records/sharegpt.jsonl"
printf '[{"messages":[{"role":"user","content":"Q"},{"role":"assistant","content":"A"}]},{"messages":[]}]' \
  > "$SEEDS/fuzz_mllm_records/array.json"
printf '[{"id":"a","image":"0.png","conversations":[{"from":"human","value":"<image>\\nWhat?"},{"from":"gpt","value":"A boot."}]}]' \
  > "$SEEDS/fuzz_mllm_records/llava.json"
"$FB/fuzz_record_index_cache" --write-seed "$SEEDS/fuzz_record_index_cache" >/dev/null 2>&1

# Images and videos: ffmpeg's test pattern in each format and pixel layout the decoders take.
mkdir -p "$SEEDS/fuzz_image" "$SEEDS/fuzz_video"
ff() { ffmpeg -loglevel error -y "$@"; }
ff -f lavfi -i testsrc=size=16x12 -frames:v 1 "$SEEDS/fuzz_image/rgb.png"
ff -f lavfi -i testsrc=size=16x12 -frames:v 1 -pix_fmt gray "$SEEDS/fuzz_image/gray.png"
ff -f lavfi -i testsrc=size=16x12 -frames:v 1 -pix_fmt rgba "$SEEDS/fuzz_image/rgba.png"
ff -f lavfi -i testsrc=size=16x12 -frames:v 1 -pix_fmt rgb48be "$SEEDS/fuzz_image/rgb16.png"
ff -f lavfi -i testsrc=size=16x12 -frames:v 1 -pix_fmt pal8 "$SEEDS/fuzz_image/palette.png"
ff -f lavfi -i testsrc=size=16x12 -frames:v 1 "$SEEDS/fuzz_image/baseline.jpg"
ff -f lavfi -i testsrc=size=16x12 -frames:v 1 -pix_fmt gray "$SEEDS/fuzz_image/gray.jpg"
ff -f lavfi -i testsrc=size=16x12 -frames:v 1 "$SEEDS/fuzz_image/lossy.webp"
ff -f lavfi -i testsrc=size=16x12 -frames:v 1 -lossless 1 "$SEEDS/fuzz_image/lossless.webp"
ff -f lavfi -i testsrc=size=16x12 -frames:v 1 "$SEEDS/fuzz_image/rgb.bmp"
ff -f lavfi -i testsrc=size=16x12 -frames:v 1 -pix_fmt pal8 "$SEEDS/fuzz_image/palette.bmp"
ff -f lavfi -i testsrc=size=16x12 -frames:v 1 "$SEEDS/fuzz_image/one.gif"
ff -f lavfi -i testsrc=size=32x24:rate=8 -frames:v 8 -c:v libx264 -pix_fmt yuv420p "$SEEDS/fuzz_video/h264.mp4"
ff -f lavfi -i testsrc=size=32x24:rate=8 -frames:v 8 -c:v libvpx "$SEEDS/fuzz_video/vp8.webm"
ff -f lavfi -i testsrc=size=32x24:rate=8 -frames:v 8 -c:v mjpeg "$SEEDS/fuzz_video/mjpeg.avi"
ff -f lavfi -i testsrc=size=32x24:rate=8 -frames:v 8 -c:v mpeg4 "$SEEDS/fuzz_video/mpeg4.mkv"
ff -f lavfi -i testsrc=size=32x24:rate=8 -frames:v 4 "$SEEDS/fuzz_video/anim.gif"

rm -rf "$W"
n=$(find "$SEEDS" -path "$SEEDS/checkpoint" -prune -o -type f -print | wc -l)
echo "fuzz seeds: $n files in $(ls -d "$SEEDS"/fuzz_* | wc -l) corpora under $SEEDS"
touch "$SEEDS/.done"
