// ReleaseGil: releases the GIL for its scope, as nanobind::gil_scoped_release does, except
// when the interpreter ends the thread on the way back.
//
// At interpreter exit, a daemon thread that asks for the GIL again is ended by CPython
// (PyThread_exit_thread: pthread_exit, up to Python 3.13), which unwinds its stack with a
// forced unwind. Unwinding out of a destructor, as gil_scoped_release's is, calls
// std::terminate, and the whole process aborts as it exits ("terminate called without an
// active exception"). That is what a multiprocessing Queue's feeder thread met when its
// process exited in the middle of a depot call (a DataLoader worker told to stop while it
// sent a batch: its loader saw the worker "killed by signal: Aborted"). Here the thread
// waits for the process to end instead, as Python 3.14 makes such threads do: CPython gave
// the GIL up before ending it, and the call holds none of depot's locks by then.
#pragma once

#include <Python.h>
#include <cxxabi.h>
#include <unistd.h>

namespace depot::python {

class ReleaseGil {
 public:
  ReleaseGil() : state_(PyEval_SaveThread()) {}
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;
  ~ReleaseGil() {
    try {
      PyEval_RestoreThread(state_);
    } catch (abi::__forced_unwind&) {
      for (;;) ::pause();  // the process is exiting: never leave this handler
    }
  }

 private:
  PyThreadState* state_;
};

}  // namespace depot::python
