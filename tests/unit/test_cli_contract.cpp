// The CLI's contract on hostile input, walked over every command that reads a file: a missing
// file, an empty one, a directory in its place, one without read permission, a truncated copy of
// a good one and random bytes. Each run must exit 1 or 2 (never 0, never a signal) with exactly one
// `error: ...` line on stderr that names the file (warnings about skipped samples may come
// before it), no C++ exception or libtorch text, no raw bytes from the file, and every file that
// was there before the run (the checkpoint, an earlier export) left as it was.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "run_command.h"

namespace fs = std::filesystem;
using mm::test::run_command;

namespace {

enum class Break { kMissing, kEmpty, kDirectory, kNoPermission, kTruncated, kRandom };
const std::vector<std::pair<Break, const char*>> kBreaks = {
    {Break::kMissing, "missing"},      {Break::kEmpty, "empty"},         {Break::kDirectory, "directory"},
    {Break::kNoPermission, "no-read"}, {Break::kTruncated, "truncated"}, {Break::kRandom, "random"}};

// A good input of each kind, made by mm itself in a few seconds: a trained tiny checkpoint and
// its export, Fashion-MNIST PNGs with mllm JSONL, moving-garment clips, a tokenizer, a umT5.
struct Fixtures {
  std::string dir, yaml, ckpt, hf, fm, mv, tok, te;
};

const Fixtures& fixtures() {
  static const Fixtures f = [] {
    Fixtures x;
    // One folder per test: CTest runs each test in its own process, two at a time.
    x.dir = mm::test::fresh_dir(std::string("cli_contract_fixtures_") +
                                ::testing::UnitTest::GetInstance()->current_test_info()->name());
    const std::string mm = mm::test::mm_binary();
    x.yaml = x.dir + "/tiny.yaml";
    mm::test::write_file(x.yaml,
                         "data:\n  dataset: text\n  paths: [/usr/share/games/fortunes]\n  format: fortune\n"
                         "  seq_len: 32\nmodel:\n  id: qwen2\n  config: {hidden_size: 32, intermediate_size: 64, "
                         "num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, "
                         "max_position_embeddings: 64, tie_word_embeddings: true}\n"
                         "training:\n  train_iters: 1\n  micro_batch_size: 2\n  optimizer: {id: adamw, lr: 1.0e-3}\n"
                         "  save_interval: 1\n");
    const std::vector<std::string> steps = {
        mm + " train " + x.yaml + " training.save_dir=" + x.dir + "/ck",
        mm + " export --checkpoint " + x.dir + "/ck --out " + x.dir + "/hf",
        mm + " data fashion-mnist --out " + x.dir + "/fm --max-train 2 --max-test 2 --threads 1",
        mm + " data moving-fashion-mnist --out " + x.dir + "/mv --train 1 --test 1",
        mm + " init tokenizer --captions " + x.dir + "/mv/train.jsonl --out " + x.dir + "/tok",
        mm + " init text-encoder --tokenizer " + x.dir + "/tok --config '{\"d_model\": 32, \"d_kv\": 8, "
             "\"d_ff\": 64, \"num_layers\": 1, \"num_heads\": 2}' --out " + x.dir + "/te"};
    for (const std::string& s : steps) {
      const auto r = run_command(s);
      if (r.exit_code != 0) throw std::runtime_error("fixture step failed: " + s + "\n" + r.output);
    }
    mm::test::write_file(x.dir + "/fm/llava.json",
                         R"([{"id": "a", "image": "images/test/00000.png", "conversations": [)"
                         R"({"from": "human", "value": "<image>\nWhat is this?"}, {"from": "gpt", "value": "A boot."}]}])");
    std::string text_records;
    for (const char* answer : {"A boot.", "A coat.", "A bag."})
      text_records += std::string(R"({"messages": [{"role": "user", "content": "What is it?"}, )") +
                      R"({"role": "assistant", "content": ")" + answer + "\"}]}\n";
    mm::test::write_file(x.dir + "/fm/text.jsonl", text_records);
    x.ckpt = x.dir + "/ck";
    x.hf = x.dir + "/hf";
    x.fm = x.dir + "/fm";
    x.mv = x.dir + "/mv";
    x.tok = x.dir + "/tok";
    x.te = x.dir + "/te";
    return x;
  }();
  return f;
}

// One command and the file it reads: `root` (a file or a folder) is copied into the case's own
// folder, `target` inside it (empty: root itself) is broken, and `command` runs with {R} standing
// for the copy of root and {O} for an output path in the case folder.
struct Case {
  std::string name, root, target, command;
  std::vector<Break> skip = {};  // breaks that are not mistakes for this file (an optional file)
  // A dataset whose bad records are skipped, each named in a warning: a truncated file may then
  // succeed on the records that remain.
  bool skips_records = false;
};

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied))
    if (e.is_regular_file() && (e.status().permissions() & fs::perms::owner_read) != fs::perms::none)
      files[e.path().string()] = mm::test::read_file(e.path().string());
  return files;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

void run_case(const Case& c) {
  const std::string base = mm::test::fresh_dir("cli_contract/" + c.name);
  fs::permissions(base, fs::perms::all);
  const bool as_root = ::geteuid() == 0;
  for (const auto& [brk, label] : kBreaks) {
    if (std::find(c.skip.begin(), c.skip.end(), brk) != c.skip.end()) continue;
    SCOPED_TRACE(c.name + " / " + label);
    const fs::path dir = fs::path(base) / label;
    fs::create_directories(dir);
    const fs::path root = dir / fs::path(c.root).filename();
    fs::copy(c.root, root, fs::copy_options::recursive);
    const fs::path t = c.target.empty() ? root : root / c.target;
    const std::string good = fs::is_regular_file(t) ? mm::test::read_file(t.string()) : "";
    switch (brk) {
      case Break::kMissing: fs::remove_all(t); break;
      case Break::kEmpty: fs::remove_all(t); mm::test::write_file(t.string(), ""); break;
      case Break::kDirectory: fs::remove_all(t); fs::create_directories(t); break;
      case Break::kNoPermission: fs::permissions(t, fs::perms::none); break;
      case Break::kTruncated: mm::test::write_file(t.string(), good.substr(0, good.size() * 5 / 8)); break;
      case Break::kRandom: fs::remove_all(t); mm::test::write_file(t.string(), random_bytes(4096, 7)); break;
    }
    // Everything in the case folder is the other account's to read and write (no-read runs as
    // `nobody` when the test runs as root: root reads any file).
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.path() != t || brk != Break::kNoPermission) fs::permissions(e.path(), fs::perms::all);
    fs::permissions(dir, fs::perms::all);
    const auto before = snapshot(dir);

    std::string cmd = c.command;
    for (size_t p; (p = cmd.find("{R}")) != std::string::npos;) cmd.replace(p, 3, root.string());
    for (size_t p; (p = cmd.find("{O}")) != std::string::npos;) cmd.replace(p, 3, (dir / "out").string());
    const std::string err_file = (dir / "stderr.txt").string();
    const std::string prefix =
        brk == Break::kNoPermission && as_root ? "setpriv --reuid=65534 --regid=65534 --clear-groups " : "";
    const auto r = run_command("cd " + dir.string() + " && timeout 300 " + prefix + cmd + " > /dev/null 2> " + err_file);
    const std::string err = mm::test::read_file(err_file);

    const std::vector<std::string> lines = lines_of(err);
    if (r.exit_code == 0 && c.skips_records && brk == Break::kTruncated) {
      ASSERT_FALSE(lines.empty()) << "a truncated record must be named: " << cmd;
      EXPECT_EQ(lines[0].rfind("warning: skipping bad record " + t.filename().string() + ":", 0), 0u) << err;
      continue;
    }
    EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << "exit " << r.exit_code << ": " << cmd << "\n" << err;
    ASSERT_FALSE(lines.empty()) << cmd;
    for (size_t i = 0; i + 1 < lines.size(); ++i)
      EXPECT_EQ(lines[i].rfind("warning: ", 0), 0u) << "only warnings before the error line:\n" << err;
    const std::string& last = lines.back();
    EXPECT_EQ(last.rfind("error: ", 0), 0u) << err;
    const std::string named = t.filename().string(), named_root = root.filename().string();
    EXPECT_TRUE(last.find(named) != std::string::npos || last.find(named_root) != std::string::npos)
        << "the error names neither " << named << " nor " << named_root << ": " << last;
    for (const char* leak : {"what()", "terminate called", "Exception raised from", "frame #", "[json.exception",
                             "basic_filebuf", "std::", "c10::"})
      EXPECT_EQ(err.find(leak), std::string::npos) << "library text on stderr: " << err;
    for (const char ch : err)
      EXPECT_TRUE(ch == '\n' || static_cast<unsigned char>(ch) >= 0x20) << "raw bytes on stderr: " << err;
    const auto after = snapshot(dir);
    for (const auto& [path, bytes] : before) {
      if (path == err_file) continue;
      const auto it = after.find(path);
      ASSERT_NE(it, after.end()) << path << " was removed by a failed run";
      EXPECT_TRUE(it->second == bytes) << path << " was changed by a failed run";
    }
    EXPECT_FALSE(fs::exists(dir / "out")) << "a failed run left its output " << (dir / "out");
  }
}

}  // namespace

TEST(CliContract, ConfigCommands) {
  const Fixtures& f = fixtures();
  const std::string mm = mm::test::mm_binary();
  for (const Case& c : std::vector<Case>{
           {"train", f.yaml, "", mm + " train {R} training.save_dir={O}"},
           {"flops", f.yaml, "", mm + " flops {R}"},
           {"memory", f.yaml, "", mm + " memory {R}"},
           {"generate-config", f.yaml, "", mm + " generate --model " + f.hf + " --config {R} --prompt hi --max-new-tokens 1"},
       })
    run_case(c);
}

TEST(CliContract, CheckpointCommands) {
  const Fixtures& f = fixtures();
  const std::string mm = mm::test::mm_binary();
  const std::string iter = f.ckpt + "/iter_0000001";
  const std::string resume = mm + " train " + f.yaml + " training.save_dir={R} training.train_iters=2 training.resume=auto";
  for (const Case& c : std::vector<Case>{
           {"export-config", iter, "config.json", mm + " export --checkpoint {R} --out {O}"},
           {"export-weights", iter, "model.safetensors", mm + " export --checkpoint {R} --out {O}"},
           {"export-state", iter, "train_state.json", mm + " export --checkpoint {R} --out {O}", {Break::kMissing}},
           {"resume-weights", f.ckpt, "iter_0000001/model.safetensors", resume},
           {"resume-optimizer", f.ckpt, "iter_0000001/optimizer.safetensors", resume},
           {"resume-state", f.ckpt, "iter_0000001/train_state.json", resume},
           {"resume-rng", f.ckpt, "iter_0000001/rng.safetensors", resume},
           {"resume-latest", f.ckpt, "latest", resume},
           {"resume-loader", f.ckpt, "iter_0000001/loader.rank00000.json", resume, {Break::kMissing}},
           {"hf-to-mm-config", f.hf, "config.json", mm + " convert hf-to-mm --in {R} --out {O} --quiet"},
           {"hf-to-mm-weights", f.hf, "model.safetensors", mm + " convert hf-to-mm --in {R} --out {O} --quiet"},
           {"mm-to-hf", iter, "model.safetensors", mm + " convert mm-to-hf --in {R} --out {O} --quiet"},
           {"resplit", iter, "config.json", mm + " convert resplit --in {R} --out {O} --quiet"},
           {"generate-weights", f.hf, "model.safetensors",
            mm + " generate --model {R} --config " + f.yaml + " --prompt hi --max-new-tokens 1"},
           {"report-metrics", f.ckpt, "metrics.jsonl", mm + " report {R} --out {O}"},
           {"report-run-info", f.ckpt, "run_info.json", mm + " report {R} --out {O}", {Break::kMissing}},
       })
    run_case(c);
}

TEST(CliContract, DataAndTokenizerCommands) {
  const Fixtures& f = fixtures();
  const std::string mm = mm::test::mm_binary();
  for (const Case& c : std::vector<Case>{
           {"inspect", f.fm, "test.jsonl", mm + " data inspect {R}/test.jsonl"},
           {"inspect-image", f.fm, "images/test/00000.png", mm + " data inspect {R}/test.jsonl"},
           {"convert-llava", f.fm, "llava.json", mm + " data convert-llava {R}/llava.json {O}"},
           {"eval-data", f.fm, "text.jsonl",
            mm + " eval --model " + f.hf + " --config " + f.yaml + " --data {R}/text.jsonl --max-new-tokens 1",
            {}, true},
           {"tokenize", f.tok, "tokenizer.json", mm + " tokenize --tokenizer {R}"},
           {"tokenize-config", f.tok, "tokenizer_config.json", mm + " tokenize --tokenizer {R}", {Break::kMissing}},
           {"init-tokenizer", f.mv, "train.jsonl", mm + " init tokenizer --captions {R}/train.jsonl --out {O}"},
           {"init-text-encoder", f.te, "config.json", mm + " init text-encoder --config {R}/config.json --out {O}"},
           {"judge", f.mv, "test.jsonl", mm + " judge --data {R}/test.jsonl --epochs 0"},
           {"judge-clip", f.mv, "clips/test/00000.mp4", mm + " judge --data {R}/test.jsonl --epochs 0"},
           {"latent-stats", f.te, "config.json", mm + " data latent-stats --model {R} --data " + f.mv + "/test.jsonl"},
       })
    run_case(c);
}

// Usage mistakes are configuration errors: one line, exit 2, the subcommand's --help named.
TEST(CliContract, UsageErrorsAreOneLine) {
  const std::string mm = mm::test::mm_binary();
  for (const std::string args : {"", "export ck out", "nonsense", "train", "eval --model m --data d --top-k x"}) {
    SCOPED_TRACE(args);
    const auto r = run_command(mm + " " + args + " 2>&1 >/dev/null");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    const auto lines = lines_of(r.output);
    ASSERT_EQ(lines.size(), 1u) << r.output;
    EXPECT_EQ(lines[0].rfind("error: ", 0), 0u) << r.output;
    EXPECT_NE(lines[0].find("--help"), std::string::npos) << r.output;
  }
  EXPECT_EQ(run_command(mm + " --help").exit_code, 0);
  EXPECT_EQ(run_command(mm + " train --help").exit_code, 0);
}

// A fresh run (no resume) into a save_dir that holds a checkpoint refuses to overwrite it.
TEST(CliContract, FreshRunKeepsAnEarlierCheckpoint) {
  const Fixtures& f = fixtures();
  const std::string dir = mm::test::fresh_dir("cli_contract_fresh");
  fs::copy(f.ckpt, dir + "/ck", fs::copy_options::recursive);
  const auto before = snapshot(dir);
  const auto r = run_command(mm::test::mm_binary() + " train " + f.yaml + " training.save_dir=" + dir + "/ck 2>&1 >/dev/null");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("already holds checkpoint iter_0000001"), std::string::npos) << r.output;
  EXPECT_EQ(lines_of(r.output).size(), 1u) << r.output;
  EXPECT_TRUE(snapshot(dir) == before);
}
