// Megatron's per-layer list expressions: --moe-layer-freq and --no-rope-freq, as its argument
// parser evaluates them (Python list arithmetic, written out here by hand) and its
// TransformerConfig expands an integer.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "transformer/layer_pattern.h"
#include "transformer/moe/moe_config.h"

namespace megatron {
namespace {

void expect_refused(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LayerPattern, ListExpressionsAsPythonEvaluatesThem) {
  // ([0]*3+[1]*1)*3 == [0,0,0,1]*3 in Python.
  EXPECT_EQ(parse_layer_pattern("([0]*3+[1]*1)*3", "--x", "0 or 1"),
            (std::vector<int>{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(parse_layer_pattern(" [1, 0] + [0]*2 ", "--x", "0 or 1"),
            (std::vector<int>{1, 0, 0, 0}));
  expect_refused([] { parse_layer_pattern("[0, 2]", "--x", "0 or 1"); }, "--x");
  expect_refused([] { parse_layer_pattern("([0]*3", "--x", "0 or 1"); }, "expected ')'");
}

TEST(LayerPattern, NoRopeFreq) {
  // Megatron's TransformerConfig: N -> [0]*(N-1)+[1] repeated num_layers / N times.
  EXPECT_EQ(parse_no_rope_freq("4", 8), (std::vector<int>{0, 0, 0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(parse_no_rope_freq("1", 2), (std::vector<int>{1, 1}));
  EXPECT_TRUE(parse_no_rope_freq("0", 8).empty());  // falsy in Megatron: off
  EXPECT_EQ(parse_no_rope_freq("([0]*3+[1]*1)*3", 12), parse_no_rope_freq("4", 12));
  expect_refused([] { parse_no_rope_freq("3", 8); }, "--no-rope-freq 3 should divide");
  expect_refused([] { parse_no_rope_freq("[0,1]", 3); }, "has 2 entries but --num-layers is 3");
  expect_refused([] { parse_no_rope_freq("four", 8); }, "--no-rope-freq");
}

TEST(LayerPattern, MoeLayerFreq) {
  // N: every N-th layer from layer 0 is MoE.
  EXPECT_EQ(parse_moe_layer_freq("2", 4), (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(parse_moe_layer_freq("([0]+[1]*3)", 4), (std::vector<int>{0, 1, 1, 1}));
  expect_refused([] { parse_moe_layer_freq("[1,0]", 4); }, "--moe-layer-freq");
  expect_refused([] { parse_moe_layer_freq("[1,3]", 2); }, "0 (dense) or 1 (MoE)");
}

}  // namespace
}  // namespace megatron
