// Megatron's WikiText and PTB detokenizers: a WikiText-103 passage touching every rule, against
// the output of Megatron's detokenizer.py run by Python (recorded here), and the choice by path.
#include <gtest/gtest.h>

#include "evaluation/detokenizer.h"

namespace megatron::evaluation {
namespace {

TEST(Detokenizer, WikiTextMatchesMegatronOnEveryRule) {
  const std::string raw =
      " = = Valkyria Chronicles III = = \n Senj\u014d no Valkyria 3 : Unrecorded Chronicles ( "
      "Japanese : \u6226\u5834\u306e\u30f4\u30a1\u30eb\u30ad\u30e5\u30ea\u30a23 , lit . Valkyria "
      "of the Battlefield 3 ) , commonly referred to as Valkyria Chronicles III outside Japan , "
      "is a tactical role @-@ playing video game . It 's 1 @,@ 000 km and 3 @.@ 5 \" the "
      "players ' \" [ sic ] { x } 45 \u00b0 C ; N of them ! Why ? = = = = Deep = = = = \n";
  const std::string python =
      " == Valkyria Chronicles III ==\nSenj\u014d no Valkyria 3: Unrecorded Chronicles "
      "(Japanese: \u6226\u5834\u306e\u30f4\u30a1\u30eb\u30ad\u30e5\u30ea\u30a23, lit. Valkyria of "
      "the Battlefield 3), commonly referred to as Valkyria Chronicles III outside Japan, is a "
      "tactical role-playing video game. It's 1,000 km and 3.5 \"the players'\" [sic] {x} "
      "45\u00b0C; 1 of them! Why? ==== Deep ====\n";
  EXPECT_EQ(wikitext_detokenize(raw), python);
}

TEST(Detokenizer, PtbAndThePathRule) {
  // Megatron replaces " N " by "1 " (no leading space), so the number joins the word before it.
  EXPECT_EQ(ptb_detokenize("it 's N dollars , $ 1 do n't \n x"), "it's1 dollars , $1 don't\nx");
  std::string name;
  EXPECT_EQ(detokenize_for_path("data/ptb.test.txt", "a 's", &name), "a's");
  EXPECT_EQ(name, "ptb");
  EXPECT_EQ(detokenize_for_path("wikitext-103/wiki.test.tokens", "a @-@ b", &name), "a-b");
  EXPECT_EQ(name, "wiki");
  EXPECT_EQ(detokenize_for_path("lambada_test.jsonl", "a @-@ b", &name), "a @-@ b");
  EXPECT_EQ(name, "lambada");
  EXPECT_EQ(detokenize_for_path("other.txt", "a @-@ b", &name), "a @-@ b");
  EXPECT_EQ(name, "none");
}

}  // namespace
}  // namespace megatron::evaluation
