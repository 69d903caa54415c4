// SentencePiece prompt tokenizer (the PaliGemma/Gemma model) as lerobot's TokenizerProcessorStep
// uses it: BOS first, no EOS, truncation and padding to a fixed length, attention mask.
// Must not throw or abort on a bad model file: every problem is a Status naming its origin.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace vlac {

/// A loaded SentencePiece model. Move-only; thread-compatible (encode is const and may run
/// concurrently on one object, as SentencePiece allows).
class Tokenizer {
 public:
  /// Parses a serialized SentencePiece model (`tokenizer.model` bytes). The bytes are copied;
  /// they need not outlive the call. `origin` names the file in errors.
  static Result<Tokenizer> from_bytes(std::span<const uint8_t> model, const std::string& origin);
  /// `path` is a `.model` file or a folder holding `tokenizer.model` (a policy's tokenizer/).
  static Result<Tokenizer> from_path(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  /// Token ids of `text` (no BOS/EOS added).
  Result<std::vector<int>> encode(std::string_view text) const;
  /// BOS id of the model (Gemma: 2); -1 if the model has none.
  int bos_id() const;
  /// Pad id of the model (Gemma: 0); -1 if the model has none.
  int pad_id() const;
  int vocab_size() const;
  const std::string& origin() const { return origin_; }

 private:
  Tokenizer() = default;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string origin_;
};

/// How lerobot's tokenizer step shapes the ids (its saved config).
struct TokenizeOptions {
  int64_t max_length = 200;
  bool truncation = true;      // keep the first max_length ids (BOS included)
  bool pad_to_max = true;      // padding "max_length"; otherwise no padding ("longest" on one prompt)
  bool pad_left = false;       // padding_side "left"
};

struct TokenizedPrompt {
  std::vector<int64_t> ids;    // [L]
  std::vector<uint8_t> mask;   // [L], 1 for real tokens
};

/// BOS + encode(prompt), truncated and padded (pad id 0 if the model defines none) as
/// lerobot's HF tokenizer call does for a Gemma tokenizer.
Result<TokenizedPrompt> tokenize_prompt(const Tokenizer& tok, std::string_view prompt, const TokenizeOptions& opt);

}  // namespace vlac
