// The detokenizers of Megatron's zero-shot WikiText evaluation (tasks/zeroshot_gpt/
// detokenizer.py): raw WikiText-103 and PTB text, whose tokens are space-separated (" @-@ ",
// " , ", "= = ="), turned back into running text before the model's tokenizer sees it. Each
// rule is Megatron's, in its order (str.replace, then re.sub with Python's semantics through
// PCRE2 in UTF/UCP mode).
#pragma once

#include <string>

namespace megatron::evaluation {

std::string wikitext_detokenize(std::string text);
std::string ptb_detokenize(std::string text);

// Megatron's choice by file name: "ptb" in the path -> PTB, "wiki" -> WikiText, "lambada" ->
// unchanged (checked in that order). A path with none of them is left unchanged here (Megatron
// fails); `name` says which applied ("ptb", "wiki", "lambada" or "none").
std::string detokenize_for_path(const std::string& path, const std::string& text,
                                std::string* name = nullptr);

}  // namespace megatron::evaluation
