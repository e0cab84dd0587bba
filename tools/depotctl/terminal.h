// The terminal as a full-screen view (`depotctl top`) uses it: plain ANSI escapes and
// termios, no curses. Everything a view changes is put back when it ends, whichever way it
// ends: q, Ctrl-C, SIGTERM, SIGHUP or an error.
#pragma once

#include <signal.h>
#include <termios.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "depot/status.h"

namespace depot::ctl {

struct ScreenSize {
  size_t columns = 80;
  size_t rows = 24;
};

// The size of the terminal on `fd` (TIOCGWINSZ). Without one (a pipe, a file), $COLUMNS
// and $LINES where set, as top(1) does, else 80x24.
ScreenSize QueryScreenSize(int fd);

// Takes over the terminal on stdin and stdout while it lives: the alternate screen (so the
// shell's scrollback is left as it was), the cursor hidden, keys read one at a time without
// echo. SIGINT, SIGTERM, SIGHUP, SIGWINCH and SIGTSTP are taken out of normal delivery and
// read from a signalfd in WaitUntil, so that none of them can end the process before the
// terminal is restored. Both stdin and stdout must be terminals. Not thread-safe; one at a
// time per process.
class FullScreen {
 public:
  FullScreen() = default;
  // Leave()s.
  ~FullScreen();
  FullScreen(const FullScreen&) = delete;
  FullScreen& operator=(const FullScreen&) = delete;

  // Takes the terminal over as above. Fails with IoError, leaving everything as it was.
  Status Enter();
  // Puts back the terminal modes, the main screen, the cursor and the signal mask.
  // Idempotent. A signal that arrived after the last WaitUntil is delivered now, with its
  // usual effect.
  void Leave();

  // Replaces the screen's contents with `lines` (at most `rows` of them, none wider than
  // the screen: a longer line would wrap and scroll the view) in one write.
  Status Draw(const std::vector<std::string>& lines, size_t rows);

  enum class Event {
    kTimeout,  // the deadline passed
    kQuit,     // q or Q, Ctrl-C (SIGINT), SIGTERM, SIGHUP, or the end of the input
    kRedraw,   // the window changed size, or the view came back from a suspend (Ctrl-Z)
  };
  // Waits for a key or a signal until `deadline`. Ctrl-Z (SIGTSTP) is handled inside:
  // the terminal is given back while the process is stopped, taken over again when it
  // continues, and kRedraw returned.
  Result<Event> WaitUntil(std::chrono::steady_clock::time_point deadline);

 private:
  // The terminal modes and screen of a view, and back; the signal mask stays as it is.
  Status TakeOver();
  void GiveBack();
  // What the signals waiting on the signalfd ask for, if anything.
  Result<std::optional<Event>> ReadSignals();
  // Whether the keys typed ask to quit.
  Result<bool> ReadKeys();

  bool active_ = false;
  int signal_fd_ = -1;
  termios saved_modes_{};
  sigset_t saved_mask_{};
};

}  // namespace depot::ctl
