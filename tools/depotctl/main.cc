// depotctl: inspect and manage a running depot daemon. This file wires the command line to
// the commands; commands.cc does the work.
#include <CLI/CLI.hpp>

#include "commands.h"
#include "format.h"

int main(int argc, char** argv) {
  using namespace depot::ctl;

  CLI::App app{"depotctl: inspect and manage a running depot daemon (depotd).", "depotctl"};
  app.require_subcommand(1);
  // Global options may also follow the subcommand: `depotctl ls --socket /tmp/d.sock`.
  app.fallthrough();
  std::string socket;
  app.add_option("--socket", socket,
                 "the daemon's socket (default: $DEPOT_SOCKET, then "
                 "$XDG_RUNTIME_DIR/depot.sock or /tmp/depot-<uid>.sock)")
      ->option_text("PATH");

  depot::Status result;

  bool status_json = false;
  auto* status = app.add_subcommand("status", "show the daemon's capacity, usage and counters");
  status->add_flag("--json", status_json, "print one JSON object");
  status->callback([&] { result = ShowStatus(socket, status_json); });

  bool ls_json = false;
  auto* ls = app.add_subcommand("ls", "list every object in the store");
  ls->add_flag("--json", ls_json, "print a JSON array of objects");
  ls->callback([&] { result = ListObjects(socket, ls_json); });

  PutOptions put_options;
  auto* put = app.add_subcommand("put", "store a file as a new object and print its id");
  put->add_option("FILE", put_options.file, "the file to store")->type_name("")->required();
  put->add_option("--name", put_options.name,
                  "store it under the id of NAME (ObjectId::FromName) instead of a random id")
      ->option_text("NAME");
  put->add_flag("--pin", put_options.pin, "never evict the object");
  put->add_flag("--checksum", put_options.checksum, "record an XXH3-64 checksum at seal");
  put->callback([&] { result = PutFile(socket, put_options); });

  std::string get_target;
  std::string get_output;
  auto* get = app.add_subcommand("get", "write an object's data to a file");
  get->add_option("OBJECT", get_target, "a 32-hex-digit object id, or a name")
      ->type_name("")
      ->required();
  get->add_option("-o,--output", get_output, "the file to write; - for standard output")
      ->option_text("FILE")
      ->type_name("")
      ->required();
  get->callback([&] { result = GetFile(socket, get_target, get_output); });

  std::vector<std::string> rm_targets;
  auto* rm = app.add_subcommand("rm", "delete objects (each goes when its last reader is done)");
  rm->add_option("OBJECT", rm_targets, "32-hex-digit object ids or names")
      ->type_name("")
      ->required();
  rm->callback([&] { result = RemoveObjects(socket, rm_targets); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!result.ok()) {
    ReportError(result);
    return 1;
  }
  return 0;
}
