// depot::Pending: waiting for an answer the daemon sends later, and giving it up.
#include <chrono>
#include <utility>

#include "depot/client.h"
#include "pending_call.h"

namespace depot {

using internal::PendingCall;
using internal::RequestMessage;

template <typename T>
Pending<T>::Pending(std::unique_ptr<PendingCall> call, Finish finish)
    : call_(std::move(call)), finish_(std::move(finish)) {}

template <typename T>
Pending<T>::Pending(Pending&&) noexcept = default;

template <typename T>
Pending<T>& Pending<T>::operator=(Pending&& other) noexcept {
  if (this != &other) {
    Pending dropped(std::move(*this));  // cancelled and given back, as when destroyed
    call_ = std::move(other.call_);
    finish_ = std::move(other.finish_);
  }
  return *this;
}

template <typename T>
Pending<T>::~Pending() {
  // In a forked child the request is the parent's, and so is its answer.
  if (!call_ || call_->taken || call_->conn->forked()) return;
  // The request stays registered with the connection until its reply is in: cancel it and
  // wait (the daemon answers a cancelled wait at once), then let what it granted go.
  if (call_->request && !call_->conn->Done(*call_->request)) (void)Cancel();
  (void)Take();
}

template <typename T>
uint64_t Pending<T>::id() const {
  return call_ && call_->request ? call_->request->id() : 0;
}

template <typename T>
bool Pending<T>::Ready(std::chrono::milliseconds wait) {
  if (!call_ || !call_->request) return true;
  if (wait.count() <= 0) return call_->conn->Done(*call_->request);
  return call_->conn->AwaitUntil(*call_->request, std::chrono::steady_clock::now() + wait)
      .has_value();
}

template <typename T>
Result<T> Pending<T>::Take() {
  if (!call_ || call_->taken) return Status::InvalidArgument("this answer was taken already");
  call_->taken = true;
  if (!call_->request) return finish_(nullptr);
  Status st = *call_->conn->AwaitUntil(*call_->request, std::nullopt);
  if (!st.ok()) return st;
  return finish_(&call_->request->reply());
}

template <typename T>
Status Pending<T>::Cancel() {
  if (!call_ || call_->taken || !call_->request) return Status::OK();
  if (call_->conn->Done(*call_->request)) return Status::OK();
  RequestMessage request;
  request.root().setCancelWait(call_->request->id());
  // Whether it was still waiting does not matter here: its answer comes either way, ahead
  // of the cancel's, which nobody reads.
  return call_->conn->SendDiscarding(request);
}

template class Pending<std::vector<Buffer>>;
template class Pending<std::vector<DeviceBuffer>>;
template class Pending<std::vector<bool>>;

}  // namespace depot
