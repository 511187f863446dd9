// models/llava/image_splice.h as a command, for tests/models/test_image_splice.py: a JSON case on
// stdin ({"batch", "text_len", "input_ids", "labels", "loss_mask", "num_image_tiles",
// "img_seq_len", "language_max_seq_len", "pad_to_max"}), the layout as JSON on stdout; an error:
// its message on stderr, exit 2.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/error.h"
#include "models/llava/image_splice.h"

int main() {
  using nlohmann::json;
  try {
    std::ostringstream text;
    text << std::cin.rdbuf();
    const json j = json::parse(text.str());
    megatron::SpliceInput in;
    in.batch = j.at("batch");
    in.text_len = j.at("text_len");
    in.input_ids = j.at("input_ids").get<std::vector<int64_t>>();
    if (j.contains("labels")) {
      in.labels = j["labels"].get<std::vector<int64_t>>();
      in.loss_mask = j.at("loss_mask").get<std::vector<float>>();
    }
    in.num_image_tiles = j.at("num_image_tiles").get<std::vector<int64_t>>();
    in.img_seq_len = j.at("img_seq_len");
    in.language_max_seq_len = j.at("language_max_seq_len");
    in.pad_to_max = j.value("pad_to_max", false);
    const megatron::SpliceLayout out = megatron::splice_image_tokens(in);
    std::vector<int> mask(out.image_mask.begin(), out.image_mask.end());
    std::cout << json{{"full_len", out.full_len},
                      {"seq_len", out.seq_len},
                      {"text_position", out.text_position},
                      {"image_mask", mask},
                      {"labels", out.labels},
                      {"loss_mask", out.loss_mask}}
                     .dump()
              << "\n";
    return 0;
  } catch (const megatron::InvalidArgument& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
