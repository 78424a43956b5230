// SentencePieceTokenizer over libsentencepiece's SentencePieceProcessor, reached through the
// dlopen()ed module libmm_sentencepiece.so (sentencepiece_shim.h says why): finding and
// loading that module, loading a model with errors that name the file, and the int64 id
// interface the rest of mm uses.
#include "mindspeed_mm/data/tokenizer/sentencepiece_tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/strings.h"
#include "mindspeed_mm/data/tokenizer/precompiled_charsmap.h"
#include "mindspeed_mm/data/tokenizer/sentencepiece_model.h"
#include "mindspeed_mm/data/tokenizer/sentencepiece_shim.h"

namespace mm::data {
namespace {

namespace fs = std::filesystem;

// Where libmm_sentencepiece.so may be, in order: $MM_SENTENCEPIECE_MODULE, beside the running
// executable (an install), and where this build tree put it.
std::vector<std::string> module_candidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("MM_SENTENCEPIECE_MODULE"); env && *env) paths.push_back(env);
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) paths.push_back((exe.parent_path() / fs::path(MM_SENTENCEPIECE_MODULE).filename()).string());
  paths.push_back(MM_SENTENCEPIECE_MODULE);
  return paths;
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// Loaded once per process and never unloaded.
const spm_shim::Api& shim() {
  static const spm_shim::Api* api = nullptr;
  static std::string failure;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    for (const auto& path : module_candidates()) {
      if (!fs::exists(path)) {
        tried += "\n  " + path + ": not found";
        continue;
      }
      // RTLD_DEEPBIND: libsentencepiece must bind to its own bundled protobuf, not libtorch's.
      // AddressSanitizer cannot run a DEEPBIND library (its interceptors would be bypassed):
      // sanitizer builds load it plainly.
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | (kSanitized ? 0 : RTLD_DEEPBIND));
      if (!handle) {
        tried += "\n  " + path + ": " + dlerror();
        continue;
      }
      auto entry = reinterpret_cast<const spm_shim::Api* (*)()>(dlsym(handle, spm_shim::kEntryPoint));
      if (!entry || entry()->version != spm_shim::kApiVersion) {
        tried += "\n  " + path + ": no " + spm_shim::kEntryPoint + " of version " +
                 std::to_string(spm_shim::kApiVersion) + " (stale build?)";
        continue;
      }
      api = entry();
      return;
    }
    failure = "sentencepiece: cannot load the module libmm_sentencepiece.so (built with mm; set "
              "MM_SENTENCEPIECE_MODULE to its path). Tried:" + tried;
  });
  if (!api) throw Error(failure);
  return *api;
}

}  // namespace

struct SentencePieceTokenizer::Impl {
  std::string path;
  const spm_shim::Api* api = nullptr;
  void* processor = nullptr;
  ~Impl() {
    if (processor) api->destroy(processor);
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

SentencePieceTokenizer SentencePieceTokenizer::from_file(const std::string& model_path) {
  // Read the bytes ourselves so a missing file says so, rather than the library's status text.
  std::error_code ec;
  MM_CHECK(fs::is_regular_file(model_path, ec), "sentencepiece: model file ", model_path,
           " does not exist or is not a regular file");
  std::ifstream in(model_path, std::ios::binary);
  MM_CHECK(in, "sentencepiece: cannot open model file ", model_path);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  MM_CHECK(!in.bad(), "sentencepiece: cannot read model file ", model_path);

  // Our own reader first: a malformed ModelProto is refused here, with the byte it broke at,
  // before the library (which may throw or abort on it) sees it.
  const SentencePieceModel checked = SentencePieceModel::parse(bytes.str(), model_path);
  PrecompiledCharsmap::check_for_sentencepiece(checked.precompiled_charsmap, model_path);
  PrecompiledCharsmap::check_for_sentencepiece(checked.denormalizer_charsmap, model_path);
  auto impl = std::make_unique<Impl>();
  impl->path = model_path;
  impl->api = &shim();
  impl->processor = impl->api->create();
  std::string error;
  bool loaded = false;
  try {
    loaded = impl->api->load(impl->processor, bytes.str(), &error);
  } catch (const std::exception& e) {
    error = printable(e.what(), 160);
  }
  MM_CHECK(loaded, "sentencepiece: ", model_path, " is not a valid SentencePiece model (", error, ")");
  // A parse that happens to succeed on garbage leaves no usable vocabulary.
  MM_CHECK(impl->api->piece_size(impl->processor) > 0, "sentencepiece: ", model_path, " has an empty vocabulary");
  return SentencePieceTokenizer(std::move(impl));
}

std::vector<int64_t> SentencePieceTokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  MM_CHECK(!add_bos || bos_id() >= 0, "sentencepiece: add_bos asked, but ", impl_->path, " has no bos token");
  MM_CHECK(!add_eos || eos_id() >= 0, "sentencepiece: add_eos asked, but ", impl_->path, " has no eos token");
  std::vector<int> ids;
  std::string error;
  MM_CHECK(impl_->api->encode(impl_->processor, text, &ids, &error), "sentencepiece: encode with ", impl_->path,
           " failed (", error, ")");
  std::vector<int64_t> out;
  out.reserve(ids.size() + 2);
  if (add_bos) out.push_back(bos_id());
  out.insert(out.end(), ids.begin(), ids.end());
  if (add_eos) out.push_back(eos_id());
  return out;
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  const int64_t n = vocab_size();
  std::vector<int> narrow;
  narrow.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    MM_CHECK(ids[i] >= 0 && ids[i] < n, "sentencepiece: id ", ids[i], " at position ", i,
             " is outside the vocabulary [0, ", n, ") of ", impl_->path);
    narrow.push_back(static_cast<int>(ids[i]));
  }
  std::string text, error;
  MM_CHECK(impl_->api->decode(impl_->processor, narrow, &text, &error), "sentencepiece: decode with ", impl_->path,
           " failed (", error, ")");
  return text;
}

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->api->piece_size(impl_->processor); }
int64_t SentencePieceTokenizer::bos_id() const { return impl_->api->bos_id(impl_->processor); }
int64_t SentencePieceTokenizer::eos_id() const { return impl_->api->eos_id(impl_->processor); }
int64_t SentencePieceTokenizer::unk_id() const { return impl_->api->unk_id(impl_->processor); }
const std::string& SentencePieceTokenizer::path() const { return impl_->path; }

std::optional<int64_t> SentencePieceTokenizer::piece_to_id(std::string_view piece) const {
  // PieceToId answers unk_id for a piece it does not know; only the unk piece itself maps there.
  int id = impl_->api->piece_to_id(impl_->processor, piece);
  if (id < 0) return std::nullopt;
  if (id == unk_id() && impl_->api->id_to_piece(impl_->processor, id) != piece) return std::nullopt;
  return id;
}

}  // namespace mm::data
