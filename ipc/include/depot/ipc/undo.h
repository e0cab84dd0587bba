// Undo: runs a function on scope exit unless cancelled. The undo steps of a multi-step
// acquisition (allocate, export, map, ...), each cancelled once the whole has succeeded.
#pragma once

#include <utility>

namespace depot::ipc {

template <typename F>
class Undo {
 public:
  explicit Undo(F f) : f_(std::move(f)) {}
  Undo(const Undo&) = delete;
  Undo& operator=(const Undo&) = delete;
  ~Undo() {
    if (armed_) f_();
  }
  void Cancel() { armed_ = false; }

 private:
  F f_;
  bool armed_ = true;
};

}  // namespace depot::ipc
