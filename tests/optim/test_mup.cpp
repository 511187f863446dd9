// --use-mup's parameter classes and rates (optim/mup.h, StepRates): Megatron core 0.19's
// get_mup_config_overrides restated on a parameter of each kind, for Adam, SGD and Muon.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "optim/adamw.h"
#include "optim/mup.h"

namespace megatron {
namespace {

struct Params {
  std::map<std::string, Param> by_name;
  std::vector<Param*> list;
  Params() {
    auto add = [&](const std::string& name, Shape shape) -> Param& {
      Param& p = by_name[name];
      p.name = name;
      p.shape = shape;
      list.push_back(&p);
      return p;
    };
    add("decoder.layers.0.mlp.linear_fc1.weight", {8, 4});
    add("decoder.layers.0.input_layernorm.weight", {4});
    add("decoder.layers.0.mlp.router.weight", {3, 4});
    add("embedding.position_embeddings.weight", {16, 4});
    add("embedding.word_embeddings.weight", {32, 4}).is_embedding_or_output = true;
    add("output_layer.weight", {32, 4}).is_embedding_or_output = true;
    // Mamba's conv1d: [channels, d_conv] here, 3-D in Megatron.
    add("decoder.layers.0.mixer.conv1d.weight", {6, 4}).megatron_ndim = 3;
  }
  Param::MupClass of(const std::string& name) { return by_name.at(name).mup_class; }
};

using C = Param::MupClass;

TEST(Mup, AdamScalesTheHiddenMatricesOnly) {
  Params ps;
  assign_mup_classes(ps.list, "adam");
  EXPECT_EQ(ps.of("decoder.layers.0.mlp.linear_fc1.weight"), C::kHidden);
  EXPECT_EQ(ps.of("decoder.layers.0.mlp.router.weight"), C::kHidden);
  EXPECT_EQ(ps.of("decoder.layers.0.mixer.conv1d.weight"), C::kHidden);
  EXPECT_EQ(ps.of("decoder.layers.0.input_layernorm.weight"), C::kNone);
  EXPECT_EQ(ps.of("embedding.position_embeddings.weight"), C::kNone);
  EXPECT_EQ(ps.of("embedding.word_embeddings.weight"), C::kNone);
  EXPECT_EQ(ps.of("output_layer.weight"), C::kNone);
  // m = 4: lr / 4 and eps / 4 for the hidden ones; the embeddings keep their (decoupled) rate.
  StepRates r{1e-3, 2e-3, 0.1};
  r.hidden_lr = 1e-3 / 4;
  r.hidden_eps_scale = 0.25;
  const Param& fc1 = ps.by_name.at("decoder.layers.0.mlp.linear_fc1.weight");
  const Param& norm = ps.by_name.at("decoder.layers.0.input_layernorm.weight");
  const Param& word = ps.by_name.at("embedding.word_embeddings.weight");
  EXPECT_EQ(r.lr_of(fc1), 1e-3 / 4);
  EXPECT_EQ(r.eps_of(fc1, 1e-8), 0.25e-8);
  EXPECT_EQ(r.lr_of(norm), 1e-3);
  EXPECT_EQ(r.eps_of(norm, 1e-8), 1e-8);
  EXPECT_EQ(r.lr_of(word), 2e-3);
  // Without --use-mup nothing changes.
  StepRates plain{1e-3, 1e-3, 0.1};
  EXPECT_EQ(plain.lr_of(fc1), 1e-3);
  EXPECT_EQ(plain.eps_of(fc1, 1e-8), 1e-8);
}

TEST(Mup, SgdScalesTheVectorsAndEmbeddings) {
  Params ps;
  assign_mup_classes(ps.list, "sgd");
  EXPECT_EQ(ps.of("decoder.layers.0.mlp.linear_fc1.weight"), C::kNone);
  EXPECT_EQ(ps.of("decoder.layers.0.mixer.conv1d.weight"), C::kNone);
  EXPECT_EQ(ps.of("decoder.layers.0.input_layernorm.weight"), C::kVector);
  EXPECT_EQ(ps.of("embedding.position_embeddings.weight"), C::kVector);
  EXPECT_EQ(ps.of("embedding.word_embeddings.weight"), C::kVector);
  StepRates r{1e-2, 4e-2, 0};
  r.vector_lr = 4e-2;
  EXPECT_EQ(r.lr_of(ps.by_name.at("embedding.position_embeddings.weight")), 4e-2);
  EXPECT_EQ(r.lr_of(ps.by_name.at("decoder.layers.0.mlp.linear_fc1.weight")), 1e-2);
}

TEST(Mup, MuonKeepsItsMatricesRates) {
  Params ps;
  assign_mup_classes(ps.list, "muon");
  EXPECT_EQ(ps.of("decoder.layers.0.mlp.linear_fc1.weight"), C::kNone);  // Muon's
  EXPECT_EQ(ps.of("decoder.layers.0.mixer.conv1d.weight"), C::kHidden);  // Adam's, 3-D
  EXPECT_EQ(ps.of("decoder.layers.0.input_layernorm.weight"), C::kNone);
}

}  // namespace
}  // namespace megatron
