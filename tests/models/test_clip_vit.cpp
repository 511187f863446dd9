// The CLIP vision encoder and the vision projection: Megatron's parameter-count fixture, the
// patch GEMM against a direct convolution, and every gradient by finite differences in fp64.
//
// Tolerances: the FD check's own (testing/layer_gradients.h: step 1e-6 in fp64, 1e-7 absolute +
// 1e-5 relative); the convolution compares two fp64 sums of the same 3 p p products in different
// orders, so 1e-12 covers their rounding.
#include <gtest/gtest.h>

#include <cmath>

#include "comm/process_group.h"
#include "models/vision/clip_vit.h"
#include "models/vision/vision_projection.h"
#include "tensor/ops.h"
#include "testing/layer_gradients.h"
#include "testing/testing.h"

namespace megatron {
namespace {

TransformerConfig lm_config(int64_t vision_hidden, int64_t heads, int64_t img, int64_t patch,
                            int64_t layers) {
  TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = 12;
  c.num_attention_heads = 2;
  c.seq_length = 8;
  c.vocab_size = 16;
  c.hidden_dropout = c.attention_dropout = 0;
  c.init_method_std = 0.3;  // large enough that every path carries signal
  c.compute_dtype = DType::kF64;
  c.vision.model_type = "clip";
  c.vision.num_layers = layers;
  c.vision.hidden_size = vision_hidden;
  c.vision.num_attention_heads = heads;
  c.vision.img_h = c.vision.img_w = img;
  c.vision.patch_dim = patch;
  c.finalize();
  return c;
}

struct SelfGroup {
  std::shared_ptr<ProcessGroup> group = make_self_process_group();
  TensorParallelContext tp() const { return TensorParallelContext{group.get(), false, {}}; }
};

int64_t count(const std::vector<Param*>& ps) {
  int64_t n = 0;
  for (const Param* p : ps) n += p->shape.numel();
  return n;
}

// Megatron's tests/unit_tests/models/test_clip_vit_model.py: 2 layers, hidden 64, 4 heads,
// 336 x 336 images in 14 x 14 patches.
TEST(ClipVit, MegatronParameterCountAndOutputShape) {
  SelfGroup g;
  TransformerConfig lm = lm_config(64, 4, 336, 14, 2);
  lm.compute_dtype = DType::kF32;
  ClipVisionModel vit(lm, g.tp());
  std::vector<Param*> ps;
  vit.collect(ps);
  EXPECT_EQ(count(ps), 174720);  // Megatron's fixture
  EXPECT_EQ(vit.conv1.weight.shape.numel(), 37632);
  EXPECT_EQ(vit.position_embeddings.shape.numel(), 36928);
  ParamSet params(ps, DType::kF32);
  params.initialize(1);
  params.sync_compute_from_main();
  ClipVisionModel::Ctx ctx;
  const Tensor images = testing::random_tensor({2, 3, 336, 336}, 2, 1.0, DType::kF32);
  const Tensor out = vit.forward(images, ctx, ForwardMode{});
  EXPECT_EQ(out.shape(), (Shape{577, 2, 64}));  // Megatron's [2, 577, 64] as [s, b, h]
}

// Row t n + i of the patch GEMM is the stride-p convolution's output at patch t of image i.
TEST(ClipVit, PatchGemmIsTheConvolution) {
  const int64_t n = 2, h = 12, w = 8, p = 4, out = 5, gw = w / p;
  const Tensor images = testing::random_tensor({n, 3, h, w}, 3, 1.0, DType::kF64);
  const Tensor weight = testing::random_tensor({out, 3, p, p}, 4, 1.0, DType::kF64);
  const Tensor rows = unfold_patches(images, p);
  ASSERT_EQ(rows.shape(), (Shape{(h / p) * gw * n, 3 * p * p}));
  Tensor y = Tensor::zeros({rows.dim(0), out}, DType::kF64);
  ops::matmul(y, rows, false, weight.view({out, 3 * p * p}), true);
  const double* img = images.data<double>();
  const double* wt = weight.data<double>();
  for (int64_t gy = 0; gy < h / p; ++gy)
    for (int64_t gx = 0; gx < gw; ++gx)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t o = 0; o < out; ++o) {
          double want = 0;
          for (int64_t c = 0; c < 3; ++c)
            for (int64_t ky = 0; ky < p; ++ky)
              for (int64_t kx = 0; kx < p; ++kx)
                want += wt[((o * 3 + c) * p + ky) * p + kx] *
                        img[((i * 3 + c) * h + gy * p + ky) * w + gx * p + kx];
          EXPECT_NEAR(y.item(((gy * gw + gx) * n + i) * out + o), want, 1e-12);
        }
}

// ViT then projector, as LLaVA runs them; the images are f32 so that only parameters are checked
// (an image has no gradient).
void check_vit_and_projection(const std::string& projection) {
  SelfGroup g;
  TransformerConfig lm = lm_config(8, 2, 6, 3, 2);
  lm.vision.projection_type = projection;
  lm.vision.projection_ffn_hidden_size = 10;
  ClipVisionModel vit(lm, g.tp());
  VisionProjection proj(lm, 8, g.tp());
  std::vector<Param*> ps;
  vit.collect(ps);
  proj.collect(ps);
  ClipVisionModel::Ctx vctx;
  VisionProjection::Ctx pctx;
  testing::check_layer_gradients({ps,
                                  [&](const Tensor& images) {
                                    vctx = {};
                                    pctx = {};
                                    return proj.forward(vit.forward(images, vctx, ForwardMode{}),
                                                        pctx, ForwardMode{});
                                  },
                                  [&](const Tensor& dy) {
                                    vit.backward(proj.backward(dy, pctx), vctx);
                                    return Tensor();
                                  }},
                                 testing::random_tensor({2, 3, 6, 6}, 5, 1.0, DType::kF32), 6);
}

TEST(ClipVit, GradientsWithMlpProjection) {
  check_vit_and_projection("mlp");
}
TEST(ClipVit, GradientsWithAffineProjection) {
  check_vit_and_projection("affine");
}

TEST(ClipVit, BadSizesNameTheFlags) {
  TransformerConfig lm = lm_config(8, 2, 6, 3, 2);
  lm.vision.img_h = 7;
  EXPECT_THROW(
      {
        try {
          vision_transformer_config(lm);
        } catch (const std::exception& e) {
          EXPECT_NE(std::string(e.what()).find("--patch-dim"), std::string::npos) << e.what();
          throw;
        }
      },
      std::exception);
}

}  // namespace
}  // namespace megatron
