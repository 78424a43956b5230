// Safetensors IO and HF weight directories: bit-exact round trips of every dtype, the writer's
// byte layout against hand-built bytes, rejection of malformed files, HF-style sharding.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"

namespace {

namespace fs = std::filesystem;
using mm::st::HFWeights;
using mm::st::SafetensorsReader;
using Named = std::vector<std::pair<std::string, at::Tensor>>;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::path(::testing::TempDir()) / "mm_st_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file by the format's rules: 8-byte LE header length, header, data.
std::string st_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

std::string tensor_bytes(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

// Random bit patterns (NaN payloads, denormals, infinities included), bools restricted to 0/1.
at::Tensor random_bits(at::ScalarType dtype, std::vector<int64_t> shape, std::mt19937& rng) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (int64_t i = 0; i < t.numel() * t.element_size(); ++i)
    p[i] = dtype == at::kBool ? rng() % 2 : static_cast<uint8_t>(rng());
  return t;
}

void expect_bit_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  EXPECT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(tensor_bytes(got) == tensor_bytes(want)) << what;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const mm::Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(SafetensorsDtype, NamesRoundTrip) {
  const std::pair<at::ScalarType, const char*> table[] = {
      {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
      {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
      {at::kByte, "U8"},    {at::kBool, "BOOL"}};
  for (const auto& [t, name] : table) {
    EXPECT_EQ(mm::st::dtype_to_safetensors(t), name);
    EXPECT_EQ(mm::st::dtype_from_safetensors(name), t);
  }
  EXPECT_NE(error_of([] { mm::st::dtype_from_safetensors("F7"); }).find("unknown dtype \"F7\""), std::string::npos);
  EXPECT_NE(error_of([] { mm::st::dtype_to_safetensors(at::kComplexFloat); }).find("no safetensors equivalent"),
            std::string::npos);
}

TEST(Safetensors, RoundTripEveryDtypeBitExact) {
  TempDir dir;
  std::mt19937 rng(1234);
  const at::ScalarType dtypes[] = {at::kFloat, at::kHalf, at::kBFloat16, at::kLong, at::kInt,
                                   at::kByte,  at::kBool, at::kDouble,   at::kChar, at::kShort};
  const std::vector<std::vector<int64_t>> shapes = {{2, 3, 5}, {}, {0}, {3, 0, 2}, {7}};
  Named tensors;
  for (auto dt : dtypes)
    for (size_t s = 0; s < shapes.size(); ++s)
      tensors.emplace_back(mm::cat(c10::toString(dt), "/", s), random_bits(dt, shapes[s], rng));
  // A non-contiguous input is written as its contiguous values.
  tensors.emplace_back("transposed", random_bits(at::kFloat, {4, 6}, rng).t());

  const std::string path = dir / "all.safetensors";
  mm::st::save_safetensors(path, tensors);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  SafetensorsReader r(path);
  ASSERT_EQ(r.keys().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, want] = tensors[i];
    EXPECT_EQ(r.keys()[i], name);  // offsets follow insertion order
    expect_bit_equal(r.get(name), want, name);
    expect_bit_equal(r.get_copy(name), want, name);
  }
  EXPECT_EQ(r.get("Float/1").dim(), 0);
  EXPECT_EQ(r.get("Float/3").numel(), 0);
  EXPECT_TRUE(r.metadata().empty());
  // The header is padded so the data section is 8-byte aligned.
  EXPECT_EQ(r.data_offset() % 8, 0u);
}

TEST(Safetensors, GetIsZeroCopyAndOutlivesReader) {
  TempDir dir;
  const std::string path = dir / "w.safetensors";
  at::Tensor w = at::arange(12, at::kFloat).reshape({3, 4});
  mm::st::save_safetensors(path, {{"w", w}});
  at::Tensor view, copy;
  {
    SafetensorsReader r(path);
    view = r.get("w");
    copy = r.get_copy("w");
    EXPECT_NE(view.data_ptr(), copy.data_ptr());
    EXPECT_EQ(r.get("w").data_ptr(), view.data_ptr());  // both view the one mapping
  }
  // The mapping stays alive with the tensor; in-place writes never reach the file.
  EXPECT_TRUE(at::equal(view, w));
  view.add_(1);
  EXPECT_TRUE(at::equal(view, w + 1));
  EXPECT_TRUE(at::equal(SafetensorsReader(path).get("w"), w));
  EXPECT_TRUE(at::equal(copy, w));
}

TEST(Safetensors, MetadataRoundTrip) {
  TempDir dir;
  const std::string path = dir / "m.safetensors";
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"step", "100"}, {"note", "ünïcödé \"q\""}};
  mm::st::save_safetensors(path, {{"x", at::ones({2})}}, meta);
  SafetensorsReader r(path);
  EXPECT_EQ(r.metadata(), meta);
  EXPECT_EQ(r.path(), path);
  EXPECT_TRUE(r.has("x"));
  EXPECT_FALSE(r.has("__metadata__"));
  EXPECT_EQ(r.info("x").dtype, at::kFloat);
  EXPECT_EQ(r.info("x").shape, std::vector<int64_t>{2});
  EXPECT_EQ(r.info("x").begin, 0u);
  EXPECT_EQ(r.info("x").end, 8u);
}

// The bytes Python's safetensors writes for {"a": float32 [1, -2], "b": int8 [1, 2, 3]} with
// metadata {"format": "pt"}: compact JSON, __metadata__ first, space-padded to 8 bytes.
TEST(Safetensors, ByteExactLayout) {
  TempDir dir;
  const std::string path = dir / "exact.safetensors";
  at::Tensor a = at::tensor({1.0f, -2.0f});
  at::Tensor b = at::tensor({1, 2, 3}, at::kChar);
  mm::st::save_safetensors(path, {{"a", a}, {"b", b}}, {{"format", "pt"}});

  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I8","shape":[3],"data_offsets":[8,11]}})";
  ASSERT_EQ(header.size(), 138u);
  header += std::string(6, ' ');  // 138 -> 144
  const std::string data = std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8) + std::string("\x01\x02\x03", 3);
  const std::string expected = st_file(header, data);
  EXPECT_TRUE(read_bytes(path) == expected) << "got header: " << read_bytes(path).substr(8, 144);

  // And a hand-built file reads back through our reader.
  const std::string hand = dir / "hand.safetensors";
  write_bytes(hand, expected);
  SafetensorsReader r(hand);
  EXPECT_EQ(r.keys(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(at::equal(r.get("a"), a));
  EXPECT_TRUE(at::equal(r.get("b"), b));
  EXPECT_EQ(r.metadata().at("format"), "pt");
}

TEST(Safetensors, ReadsHeaderOrderIndependentlyAndUnalignedOffsets) {
  TempDir dir;
  // Keys listed out of offset order; "i" (int32) starts at byte 1, misaligned for its dtype.
  std::string header =
      R"({"i":{"dtype":"I32","shape":[2],"data_offsets":[1,9]},"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
      R"("e":{"dtype":"F32","shape":[0,4],"data_offsets":[9,9]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  int32_t vals[2] = {-7, 123456};
  std::string data = "\x2a" + std::string(reinterpret_cast<const char*>(vals), 8);
  const std::string path = dir / "order.safetensors";
  write_bytes(path, st_file(header, data));
  SafetensorsReader r(path);
  EXPECT_EQ(r.keys(), (std::vector<std::string>{"u", "i", "e"}));
  EXPECT_EQ(r.get("u").item<uint8_t>(), 42);
  at::Tensor i = r.get("i");
  EXPECT_EQ(i[0].item<int32_t>(), -7);
  EXPECT_EQ(i[1].item<int32_t>(), 123456);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(i.data_ptr()) % 4, 0u);  // copied, not a misaligned view
  EXPECT_EQ(r.get("e").sizes(), (std::vector<int64_t>{0, 4}));
}

struct Malformed { const char* what; std::string bytes; const char* message; };

TEST(Safetensors, RejectsMalformedFiles) {
  const std::string f4(8, '\0');  // 8 data bytes
  auto hdr = [](const std::string& body) { return "{" + body + "}"; };
  const Malformed cases[] = {
      {"short", std::string("\x05\x00\x00", 3), "file too short (3 bytes)"},
      {"header_len", le64(1000) + "{}", "header length 1000 exceeds file size 10"},
      {"not_json", st_file("{\"a\": ", ""), "header is not valid JSON"},
      {"not_object", st_file("[1,2]", ""), "header is not a JSON object (got array)"},
      {"entry_not_object", st_file(hdr(R"("a":[1])"), ""), "tensor \"a\": entry is not a JSON object"},
      {"no_dtype", st_file(hdr(R"("a":{"shape":[2],"data_offsets":[0,8]})"), f4), "tensor \"a\": missing \"dtype\""},
      {"no_shape", st_file(hdr(R"("a":{"dtype":"F32","data_offsets":[0,8]})"), f4), "missing \"shape\""},
      {"no_offsets", st_file(hdr(R"("a":{"dtype":"F32","shape":[2]})"), f4), "missing \"data_offsets\""},
      {"bad_dtype", st_file(hdr(R"("a":{"dtype":"F7","shape":[2],"data_offsets":[0,8]})"), f4),
       "unknown dtype \"F7\""},
      {"neg_dim", st_file(hdr(R"("a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), f4),
       "negative dimension -2"},
      {"float_dim", st_file(hdr(R"("a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})"), f4),
       "non-integer dimension 2.5"},
      {"one_offset", st_file(hdr(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8]})"), f4),
       "\"data_offsets\" must be 2 non-negative integers"},
      {"begin_gt_end", st_file(hdr(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]})"), f4),
       "data_offsets begin 8 > end 0"},
      {"size_mismatch", st_file(hdr(R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), f4),
       "data_offsets span 8 bytes but F32 [3] needs 12 bytes"},
      {"beyond_eof", st_file(hdr(R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]})"), f4),
       "data_offsets end 16 is beyond the data section (8 bytes)"},
      {"overlap",
       st_file(hdr(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[1],"data_offsets":[4,8]})"),
               f4),
       "tensor \"b\": data_offsets [4, 8] overlap tensor \"a\""},
      {"gap", st_file(hdr(R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})"), f4),
       "gap in data section: bytes [0, 4)"},
      {"trailing", st_file(hdr(R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})"), f4),
       "data section has 8 bytes but tensors cover only 4 (trailing bytes)"},
      {"dup_tensor",
       st_file(hdr(R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})"),
               f4),
       "duplicate tensor name \"a\""},
      {"dup_field", st_file(hdr(R"("a":{"dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8]})"), f4),
       "entry \"a\": duplicate key \"dtype\""},
      {"meta_not_string", st_file(hdr(R"("__metadata__":{"step":100})"), ""),
       "__metadata__ value for \"step\" is not a string"},
      {"dtype_not_string", st_file(hdr(R"("a":{"dtype":4,"shape":[2],"data_offsets":[0,8]})"), f4),
       "\"dtype\" is not a string"},
  };
  TempDir dir;
  std::set<std::string> messages;
  for (const auto& c : cases) {
    const std::string path = dir / (std::string(c.what) + ".safetensors");
    write_bytes(path, c.bytes);
    const std::string err = error_of([&] { SafetensorsReader r(path); });
    EXPECT_NE(err.find(c.message), std::string::npos) << c.what << ": " << err;
    EXPECT_NE(err.find(path), std::string::npos) << c.what << ": message must name the file: " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << c.what << ": one line";
    messages.insert(c.message);
  }
  EXPECT_EQ(messages.size(), std::size(cases));  // each case checks a distinct message

  EXPECT_NE(error_of([&] { SafetensorsReader r(dir / "absent.safetensors"); }).find("cannot open"),
            std::string::npos);
}

TEST(Safetensors, MissingKeyNamesFileAndKey) {
  TempDir dir;
  const std::string path = dir / "k.safetensors";
  mm::st::save_safetensors(path, {{"present", at::zeros({1})}});
  SafetensorsReader r(path);
  const std::string err = error_of([&] { r.get("absent.weight"); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("no tensor \"absent.weight\""), std::string::npos) << err;
}

TEST(Safetensors, WriterRejectsBadInputAndKeepsOldFile) {
  TempDir dir;
  const std::string path = dir / "keep.safetensors";
  mm::st::save_safetensors(path, {{"old", at::ones({3})}});
  const std::string before = read_bytes(path);
  auto save = [&](Named t) { return error_of([&] { mm::st::save_safetensors(path, t); }); };

  EXPECT_NE(save({{"x", at::ones({1})}, {"x", at::ones({1})}}).find("duplicate tensor name \"x\""), std::string::npos);
  EXPECT_NE(save({{"__metadata__", at::ones({1})}}).find("is reserved"), std::string::npos);
  EXPECT_NE(save({{"u", at::Tensor()}}).find("tensor \"u\": tensor is undefined"), std::string::npos);
  EXPECT_NE(save({{"c", at::ones({1}, at::kComplexFloat)}}).find("tensor \"c\": "), std::string::npos);
  EXPECT_NE(error_of([&] { mm::st::save_safetensors(dir / "no/such/dir/x.safetensors", {}); }).find("cannot create"),
            std::string::npos);

  EXPECT_TRUE(read_bytes(path) == before);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // A successful save replaces the file whole.
  mm::st::save_safetensors(path, {{"new", at::full({2}, 5.0)}});
  SafetensorsReader r(path);
  EXPECT_EQ(r.keys(), std::vector<std::string>{"new"});
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

// ---------------------------------------------------------------------------------------------

Named six_tensors() {
  Named t;
  for (int i = 0; i < 6; ++i)
    t.emplace_back(mm::cat("model.layers.", i, ".weight"), at::arange(16, at::kFloat) + 100 * i);  // 64 bytes
  return t;
}

TEST(HFWeights, ShardedSaveAndReadThroughIndex) {
  TempDir dir;
  const Named tensors = six_tensors();
  mm::st::save_hf_weights(dir.str(), tensors, /*max_shard_bytes=*/128);  // two tensors per shard

  const char* shard_names[] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                               "model-00003-of-00003.safetensors"};
  for (const char* s : shard_names) EXPECT_TRUE(fs::exists(dir / s)) << s;
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));

  const std::string index_text = read_bytes(dir / "model.safetensors.index.json");
  EXPECT_EQ(index_text.rfind("{\n  \"metadata\": {\n    \"total_size\": 384\n  },\n  \"weight_map\": {\n", 0), 0u)
      << index_text;
  EXPECT_EQ(index_text.back(), '\n');
  const auto index = nlohmann::json::parse(index_text);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 384u);
  ASSERT_EQ(index["weight_map"].size(), 6u);
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(index["weight_map"][tensors[i].first].get<std::string>(), shard_names[i / 2]) << i;

  SafetensorsReader shard1(dir / shard_names[0]);
  EXPECT_EQ(shard1.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(shard1.keys().size(), 2u);

  for (const std::string& source : {dir.str(), dir / "model.safetensors.index.json"}) {
    HFWeights w(source);
    EXPECT_EQ(w.keys().size(), 6u);
    EXPECT_EQ(w.files().size(), 3u);
    for (const auto& [name, t] : tensors) {
      ASSERT_TRUE(w.has(name));
      EXPECT_TRUE(at::equal(w.get(name), t)) << name;
      EXPECT_EQ(w.info(name).shape, std::vector<int64_t>{16});
    }
  }
  // A single shard opens as a plain file.
  HFWeights one(dir / shard_names[2]);
  EXPECT_EQ(one.keys(), (std::vector<std::string>{"model.layers.4.weight", "model.layers.5.weight"}));
}

TEST(HFWeights, OversizedTensorGetsItsOwnShard) {
  TempDir dir;
  Named t = {{"a", at::zeros({16})}, {"big", at::ones({75})}, {"c", at::full({16}, 2.0)}};  // 64, 300, 64 bytes
  mm::st::save_hf_weights(dir.str(), t, 128);
  const auto index = nlohmann::json::parse(read_bytes(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 428u);
  EXPECT_EQ(index["weight_map"]["big"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["a"], "model-00002-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["c"], "model-00002-of-00002.safetensors");
  HFWeights w(dir.str());
  for (const auto& [name, x] : t) EXPECT_TRUE(at::equal(w.get(name), x)) << name;
}

TEST(HFWeights, SingleFileAndStaleFilesReplaced) {
  TempDir dir;
  mm::st::save_hf_weights(dir.str(), six_tensors(), 128);
  ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));

  // Everything fits: one model.safetensors, and the earlier shards and index are gone.
  mm::st::save_hf_weights(dir.str(), six_tensors());
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / "model-00001-of-00003.safetensors"));
  EXPECT_EQ(SafetensorsReader(dir / "model.safetensors").metadata().at("format"), "pt");
  HFWeights w(dir.str());
  EXPECT_EQ(w.keys().size(), 6u);
  EXPECT_EQ(w.files(), std::vector<std::string>{dir / "model.safetensors"});

  // And back to shards: a stale model.safetensors would shadow the index, so it goes.
  mm::st::save_hf_weights(dir.str(), six_tensors(), 200);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  EXPECT_EQ(HFWeights(dir.str()).files().size(), 2u);
  EXPECT_NE(error_of([&] { mm::st::save_hf_weights(dir.str(), {{"a", at::ones({1})}, {"a", at::ones({1})}}); })
                .find("duplicate tensor name \"a\""),
            std::string::npos);
}

TEST(HFWeights, MissingKeyAndBrokenIndexErrors) {
  TempDir dir;
  mm::st::save_hf_weights(dir.str(), six_tensors(), 128);
  HFWeights w(dir.str());
  const std::string err = error_of([&] { w.get("lm_head.weight"); });
  EXPECT_NE(err.find(dir.str()), std::string::npos) << err;
  EXPECT_NE(err.find("no tensor \"lm_head.weight\""), std::string::npos) << err;

  // An index naming a tensor its shard does not hold.
  auto index = nlohmann::json::parse(read_bytes(dir / "model.safetensors.index.json"));
  index["weight_map"]["ghost"] = "model-00001-of-00003.safetensors";
  write_bytes(dir / "model.safetensors.index.json", index.dump(2));
  const std::string ghost = error_of([&] { HFWeights(dir.str()).get("ghost"); });
  EXPECT_NE(ghost.find("maps tensor \"ghost\" to"), std::string::npos) << ghost;

  // An index naming a shard that is not there.
  index["weight_map"]["ghost"] = "model-00009-of-00009.safetensors";
  write_bytes(dir / "model.safetensors.index.json", index.dump(2));
  const std::string missing = error_of([&] { HFWeights h(dir.str()); });
  EXPECT_NE(missing.find("model-00009-of-00009.safetensors (for tensor \"ghost\") does not exist"), std::string::npos)
      << missing;

  TempDir empty;
  EXPECT_NE(error_of([&] { HFWeights h(empty.str()); }).find("no model.safetensors"), std::string::npos);
  EXPECT_NE(error_of([&] { HFWeights h(empty / "nope"); }).find("no such file or directory"), std::string::npos);
}

}  // namespace
