// Megatron's per-layer list expressions: --moe-layer-freq, --no-rope-freq and
// --window-attn-skip-freq (with the window's layers, MTP layers included), as its argument
// parser evaluates them (Python list arithmetic, written out here by hand) and its
// TransformerConfig expands an integer.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "transformer/config.h"
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

TEST(LayerPattern, WindowAttnSkipFreqAsMegatronsLayerNumbers) {
  // N: layer_number % N != 0 is a window layer (numbers from 1): with 2, layers 1 and 3 (our 0
  // and 2) have the window, 2 and 4 full attention; a list gives 1 for the window layers.
  EXPECT_EQ(parse_window_attn_skip_freq("2", 4), (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(parse_window_attn_skip_freq("3", 5), (std::vector<int>{1, 1, 0, 1, 1}));
  EXPECT_EQ(parse_window_attn_skip_freq("[1,1,1,0]*2", 8),
            (std::vector<int>{1, 1, 1, 0, 1, 1, 1, 0}));
  expect_refused([] { parse_window_attn_skip_freq("[1,0]", 4); }, "--window-attn-skip-freq");
  expect_refused([] { parse_window_attn_skip_freq("0", 4); }, "--window-attn-skip-freq");
}

TEST(LayerPattern, WindowLayersOfDecoderAndMtpLayers) {
  TransformerConfig c;
  c.num_layers = 4;
  c.window_attention = true;
  c.window_left = 127;
  EXPECT_EQ(c.attention_window(2), 127);  // no pattern: every layer
  c.window_layers = parse_window_attn_skip_freq("2", 4);
  c.window_skip_every = 2;
  EXPECT_EQ(c.attention_window(0), 127);
  EXPECT_EQ(c.attention_window(1), -1);
  // GPT's MTP depth k numbers its layer k + 1 (Megatron core 0.19's MTP numbering): depth 0 has
  // the window, depth 1 not.
  c.mtp_num_layers = 2;
  EXPECT_EQ(c.attention_window(4), 127);
  EXPECT_EQ(c.attention_window(5), -1);
  // A list pattern indexes by the same numbers.
  c.window_layers = {0, 1, 1, 1};
  c.window_skip_every = 0;
  EXPECT_EQ(c.attention_window(4), -1);
  EXPECT_EQ(c.attention_window(5), 127);
  // A hybrid model's MTP block numbers its layers 1, 2, ... within each depth.
  c.mamba.layers = "M*M*";
  c.mamba.mtp_layers = "*E";
  c.window_layers = {1, 0, 1, 0};
  c.window_skip_every = 2;
  EXPECT_EQ(c.attention_window(4), 127);  // depth 0, layer 1
  EXPECT_EQ(c.attention_window(5), -1);   // depth 0, layer 2
  EXPECT_EQ(c.attention_window(6), 127);  // depth 1, layer 1
  c.window_attention = false;
  EXPECT_EQ(c.attention_window(0), -1);
}

}  // namespace
}  // namespace megatron
