#pragma once
// The built-in default model ships as a compact artifact (tools/train_builtin/train.py writes it):
// one safetensors file holding every tensor of a gpt-oss checkpoint except the two
// [vocab, hidden] matrices, which it stores compactly:
//   builtin.config           U8 [n]       config.json's text
//   builtin.token_ids        I32 [K]      the token ids seen in training, ascending
//   model.embed_tokens.rows  BF16 [K+1, hidden]  row j for token_ids[j]; row K for all others
//   lm_head.rows             BF16 [K+1, hidden]  the same for the unembedding
// The shared unembedding row was trained so that the vocab-K unseen tokens together get
// negligible probability (see train.py). Expanding gives a Hugging Face checkpoint that every
// loader (ours, transformers) reads like any other.
#include <string>

namespace gptoss {

// Writes config.json and model.safetensors into `out_dir` (created if absent). Throws
// gptoss::Error naming the artifact when it is malformed (missing tensor, wrong dtype or shape,
// ids unsorted or out of range).
void expand_builtin_artifact(const std::string& artifact_path, const std::string& out_dir);

}  // namespace gptoss
