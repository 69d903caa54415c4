// SentencePiece wrapper: every SentencePiece status becomes a vlac Status; nothing throws out.
#include "policy/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <new>

namespace vlac {

namespace {

// SentencePiece models are a few MB (Gemma's: 4.2 MiB); refuse anything absurd before reading.
constexpr uint64_t kMaxModelBytes = 512ull << 20;

bool is_dir(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::from_bytes(std::span<const uint8_t> model, const std::string& origin) {
  if (model.empty()) return invalid_format(origin + ": empty SentencePiece model");
  if (model.size() > kMaxModelBytes) return invalid_format(origin + ": SentencePiece model larger than 512 MiB");
  Tokenizer t;
  t.origin_ = origin;
  try {
    t.sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
    const auto st = t.sp_->LoadFromSerializedProto(
        std::string_view(reinterpret_cast<const char*>(model.data()), model.size()));
    if (!st.ok())
      return invalid_format(origin + ": not a SentencePiece model (" + st.ToString() + ")");
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::ResourceExhausted, origin + ": out of memory loading the SentencePiece model");
  } catch (const std::exception& e) {
    return invalid_format(origin + ": not a SentencePiece model (" + e.what() + ")");
  }
  if (t.sp_->GetPieceSize() <= 0) return invalid_format(origin + ": SentencePiece model has no pieces");
  return t;
}

Result<Tokenizer> Tokenizer::from_path(const std::string& path) {
  const std::string file = is_dir(path) ? path + "/tokenizer.model" : path;
  struct stat st{};
  if (::stat(file.c_str(), &st) != 0) {
    if (is_dir(path)) return not_found(path + ": folder has no tokenizer.model (a SentencePiece model)");
    return not_found(file + ": no such tokenizer file");
  }
  if (uint64_t(st.st_size) > kMaxModelBytes) return invalid_format(file + ": SentencePiece model larger than 512 MiB");
  std::ifstream in(file, std::ios::binary);
  if (!in) return io_error(file + ": cannot open");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return io_error(file + ": read failed");
  return from_bytes(bytes, file);
}

Result<std::vector<int>> Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  try {
    const auto st = sp_->Encode(text, &ids);
    if (!st.ok()) return invalid_argument(origin_ + ": cannot tokenize the prompt (" + st.ToString() + ")");
  } catch (const std::exception& e) {
    return internal_error(origin_ + ": tokenizer failed (" + e.what() + ")");
  }
  return ids;
}

int Tokenizer::bos_id() const { return sp_->bos_id(); }
int Tokenizer::pad_id() const { return sp_->pad_id(); }
int Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }

Result<TokenizedPrompt> tokenize_prompt(const Tokenizer& tok, std::string_view prompt, const TokenizeOptions& opt) {
  if (opt.max_length < 1) return invalid_argument("tokenizer: max_length must be at least 1");
  VLAC_ASSIGN_OR_RETURN(std::vector<int> body, tok.encode(prompt));
  TokenizedPrompt out;
  if (tok.bos_id() >= 0) out.ids.push_back(tok.bos_id());
  for (int id : body) out.ids.push_back(id);
  if (opt.truncation && int64_t(out.ids.size()) > opt.max_length) out.ids.resize(size_t(opt.max_length));
  out.mask.assign(out.ids.size(), 1);
  if (opt.pad_to_max && int64_t(out.ids.size()) < opt.max_length) {
    const size_t n_pad = size_t(opt.max_length) - out.ids.size();
    const int64_t pad = tok.pad_id() >= 0 ? tok.pad_id() : 0;
    if (opt.pad_left) {
      out.ids.insert(out.ids.begin(), n_pad, pad);
      out.mask.insert(out.mask.begin(), n_pad, 0);
    } else {
      out.ids.insert(out.ids.end(), n_pad, pad);
      out.mask.insert(out.mask.end(), n_pad, 0);
    }
  }
  return out;
}

}  // namespace vlac
