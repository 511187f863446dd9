// TensorMap: named tensors in a fixed order, and TensorSpec: the name, shape and dtype of one.
//
// What a micro-batch holds ("tokens", "labels", ...), what one pipeline stage sends the next
// ("hidden", and later whatever else a model passes on), and what a last stage hands its loss.
// The order is the insertion order, so that two ranks that build the same map walk it the same
// way (transfers are matched in order). Not a tensor library: lookups are linear, maps hold a
// handful of entries.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "tensor/tensor.h"

namespace megatron {

struct TensorSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;
};

class TensorMap {
 public:
  using Entry = std::pair<std::string, Tensor>;

  TensorMap() = default;
  TensorMap(std::initializer_list<Entry> entries) {
    for (const Entry& e : entries) set(e.first, e.second);
  }

  // Adds `name`, or replaces its tensor (keeping its place).
  void set(const std::string& name, Tensor t) {
    for (Entry& e : entries_) {
      if (e.first == name) {
        e.second = std::move(t);
        return;
      }
    }
    entries_.emplace_back(name, std::move(t));
  }
  // The tensor of `name`; an undefined tensor when there is none.
  Tensor get(const std::string& name) const {
    const Tensor* t = find(name);
    return t ? *t : Tensor();
  }
  // The tensor of `name`, which must be there.
  const Tensor& at(const std::string& name) const {
    const Tensor* t = find(name);
    MEGATRON_ASSERT(t != nullptr, "no tensor named '", name, "' among ", names());
    return *t;
  }
  const Tensor* find(const std::string& name) const {
    for (const Entry& e : entries_) {
      if (e.first == name) return &e.second;
    }
    return nullptr;
  }
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }
  std::string names() const {
    std::string s = "{";
    for (const Entry& e : entries_) s += (s.size() > 1 ? ", " : "") + e.first;
    return s + "}";
  }

 private:
  std::vector<Entry> entries_;
};

}  // namespace megatron
