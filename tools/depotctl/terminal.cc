#include "terminal.h"

#include <poll.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string_view>

namespace depot::ctl {

namespace {

// DEC private modes 1049 (alternate screen, saving the cursor) and 25 (cursor visible).
constexpr std::string_view kEnterView = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J";
constexpr std::string_view kLeaveView = "\x1b[?1049l\x1b[?25h";
// Erase in line and erase below. A line is erased before it is written, not after: on a
// line that fills the width, the cursor waits on the last column and an erase there would
// take the last character with it.
constexpr std::string_view kHome = "\x1b[H";
constexpr std::string_view kEraseLine = "\x1b[K";
constexpr std::string_view kEraseBelow = "\x1b[J";

size_t FromEnv(const char* name, size_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  const unsigned long value = std::strtoul(text, &end, 10);
  return (end != text && *end == '\0' && value > 0 && value < 10'000) ? value : fallback;
}

Status WriteAll(std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(STDOUT_FILENO, text.data(), text.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("cannot write to the terminal", errno);
    }
    text.remove_prefix(static_cast<size_t>(n));
  }
  return Status::OK();
}

sigset_t ViewSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGWINCH, SIGTSTP}) sigaddset(&set, signo);
  return set;
}

}  // namespace

ScreenSize QueryScreenSize(int fd) {
  winsize size{};
  if (::ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0 && size.ws_row > 0) {
    return {size.ws_col, size.ws_row};
  }
  ScreenSize fallback;
  return {FromEnv("COLUMNS", fallback.columns), FromEnv("LINES", fallback.rows)};
}

FullScreen::~FullScreen() { Leave(); }

Status FullScreen::Enter() {
  if (::tcgetattr(STDIN_FILENO, &saved_modes_) != 0) {
    return Status::FromErrno("cannot read the terminal's modes", errno);
  }
  // Blocked before the terminal changes, so that from here on no signal can end the
  // process with the terminal left raw. Threads started later (the client's release
  // flusher) block every signal themselves, so the signals come to this thread's signalfd.
  const sigset_t signals = ViewSignals();
  if (const int err = ::pthread_sigmask(SIG_BLOCK, &signals, &saved_mask_); err != 0) {
    return Status::FromErrno("cannot block signals", err);
  }
  signal_fd_ = ::signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) {
    const int err = errno;
    ::pthread_sigmask(SIG_SETMASK, &saved_mask_, nullptr);
    return Status::FromErrno("cannot create a signalfd", err);
  }
  active_ = true;
  Status st = TakeOver();
  if (!st.ok()) Leave();
  return st;
}

void FullScreen::Leave() {
  if (!active_) return;
  active_ = false;
  GiveBack();
  ::close(signal_fd_);
  signal_fd_ = -1;
  ::pthread_sigmask(SIG_SETMASK, &saved_mask_, nullptr);
}

Status FullScreen::TakeOver() {
  // Non-canonical without echo: each key arrives as typed and is not printed over the view.
  // ISIG stays on, so Ctrl-C and Ctrl-Z still raise their signals.
  termios modes = saved_modes_;
  modes.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
  modes.c_cc[VMIN] = 1;
  modes.c_cc[VTIME] = 0;
  if (::tcsetattr(STDIN_FILENO, TCSANOW, &modes) != 0) {
    return Status::FromErrno("cannot set the terminal's modes", errno);
  }
  return WriteAll(kEnterView);
}

void FullScreen::GiveBack() {
  // Errors are ignored: this runs on the way out, often because the terminal is gone.
  (void)WriteAll(kLeaveView);
  ::tcsetattr(STDIN_FILENO, TCSADRAIN, &saved_modes_);
}

Status FullScreen::Draw(const std::vector<std::string>& lines, size_t rows) {
  std::string frame(kHome);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) frame += "\r\n";
    frame += kEraseLine;
    frame += lines[i];
  }
  // Below the last line, if there is room, without scrolling: a newline on the last row
  // would push the first line off the screen.
  if (lines.size() < rows) {
    frame += "\r\n";
    frame += kEraseBelow;
  }
  return WriteAll(frame);
}

Result<FullScreen::Event> FullScreen::WaitUntil(std::chrono::steady_clock::time_point deadline) {
  using std::chrono::milliseconds;
  for (;;) {
    const auto left = std::chrono::ceil<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Event::kTimeout;
    pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {signal_fd_, POLLIN, 0}};
    if (::poll(fds, 2, static_cast<int>(left.count())) < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("cannot wait for keys", errno);
    }
    if (fds[1].revents != 0) {
      DEPOT_ASSIGN_OR_RETURN(std::optional<Event> event, ReadSignals());
      if (event) return *event;
    }
    if (fds[0].revents != 0) {
      DEPOT_ASSIGN_OR_RETURN(bool quit, ReadKeys());
      if (quit) return Event::kQuit;
    }
  }
}

Result<std::optional<FullScreen::Event>> FullScreen::ReadSignals() {
  std::optional<Event> event;
  signalfd_siginfo info{};
  while (::read(signal_fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    switch (info.ssi_signo) {
      case SIGWINCH:
        if (!event) event = Event::kRedraw;
        break;
      case SIGTSTP:
        // Stop as Ctrl-Z would have stopped us, but with the shell's terminal given back
        // first; the view is taken over again when the shell continues us (fg).
        GiveBack();
        ::raise(SIGSTOP);
        DEPOT_RETURN_NOT_OK(TakeOver());
        if (!event) event = Event::kRedraw;
        break;
      default:  // SIGINT, SIGTERM, SIGHUP
        event = Event::kQuit;
    }
  }
  return event;
}

Result<bool> FullScreen::ReadKeys() {
  char keys[64];
  const ssize_t n = ::read(STDIN_FILENO, keys, sizeof(keys));
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN) return false;
    // EIO: the terminal hung up. There is nobody left to show anything to.
    if (errno == EIO) return true;
    return Status::FromErrno("cannot read keys", errno);
  }
  if (n == 0) return true;
  return std::string_view(keys, static_cast<size_t>(n)).find_first_of("qQ") !=
         std::string_view::npos;
}

}  // namespace depot::ctl
