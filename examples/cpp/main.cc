// Puts an object into the host's depotd, reads it back through a second connection (as
// another process would, with no copy), and checks the bytes. Exits 0 if all went well.
//
//   depot_example [SOCKET]      (default: $DEPOT_SOCKET, then the per-user default)
#include <depot/client.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  const std::string socket = argc > 1 ? argv[1] : "";
  auto writer = depot::Client::Connect(socket);
  if (!writer.ok()) {
    std::fprintf(stderr, "cannot connect: %s\n", writer.status().message().c_str());
    return 1;
  }
  const depot::ObjectId id = depot::ObjectId::FromName("depot-example/greeting");
  const std::string text = "hello from another project";

  auto buffer = writer->Create(id, text.size());
  if (!buffer.ok()) {
    std::fprintf(stderr, "create: %s\n", buffer.status().message().c_str());
    return 1;
  }
  std::memcpy(buffer->ptr(), text.data(), text.size());
  if (depot::Status sealed = writer->Seal(id); !sealed.ok()) {
    std::fprintf(stderr, "seal: %s\n", sealed.message().c_str());
    return 1;
  }

  auto reader = depot::Client::Connect(socket);
  if (!reader.ok()) {
    std::fprintf(stderr, "cannot connect: %s\n", reader.status().message().c_str());
    return 1;
  }
  auto view = reader->Get(id, std::chrono::seconds(5));
  if (!view.ok()) {
    std::fprintf(stderr, "get: %s\n", view.status().message().c_str());
    return 1;
  }
  const std::string read(reinterpret_cast<const char*>(view->ptr()), view->size());
  if (read != text) {
    std::fprintf(stderr, "read back '%s', wrote '%s'\n", read.c_str(), text.c_str());
    return 1;
  }
  std::printf("read back %zu bytes of %s: %s\n", read.size(), id.Hex().c_str(), read.c_str());
  return 0;
}
