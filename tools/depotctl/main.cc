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
  auto* status = app.add_subcommand(
      "status", "show the daemon's capacity, usage and counters, host memory and each GPU");
  status->add_flag("--json", status_json, "print one JSON object");
  status->callback([&] { result = ShowStatus(socket, status_json); });

  auto* metrics = app.add_subcommand(
      "metrics", "print the daemon's counters and latency histograms (Prometheus text format)");
  metrics->callback([&] { result = PrintMetrics(socket); });

  ListOptions ls_options;
  auto* ls = app.add_subcommand("ls", "list the objects in the store (all, or those that match)");
  ls->add_flag("--json", ls_options.json, "print a JSON array of objects");
  ls->add_option("--name", ls_options.name_glob, "only named objects whose name matches GLOB")
      ->option_text("GLOB");
  ls->add_option("--state", ls_options.state, "only objects in this state: creating or sealed")
      ->option_text("STATE");
  ls->add_option("--min-size", ls_options.min_size, "only objects of at least SIZE (e.g. 1MiB)")
      ->option_text("SIZE");
  ls->add_option("--older-than", ls_options.older_than,
                 "only objects created at least DURATION ago (e.g. 30s, 5m, 2h)")
      ->option_text("DURATION");
  ls->add_flag("--held", ls_options.held, "only objects some client holds a reference to");
  ls->add_option("--sort", ls_options.sort,
                 "order by size (largest first), age (oldest first), refs (most first) or name")
      ->option_text("KEY");
  ls->add_option("--limit", ls_options.limit, "show at most N objects (after sorting)")
      ->option_text("N");
  ls->add_option("--tier", ls_options.tier,
                 "only objects with a copy in this tier: host, gpu (any GPU) or gpuK (GPU K)")
      ->option_text("TIER");
  ls->add_option("--device", ls_options.device,
                 "only objects with a copy on the daemon's GPU K (as status lists them)")
      ->option_text("K");
  ls->callback([&] { result = ListObjects(socket, ls_options); });

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

  std::string show_target;
  bool show_json = false;
  std::string show_hexdump;
  auto* show = app.add_subcommand(
      "show", "show one object in full: header, every replica, checksum, and who holds it");
  show->add_option("OBJECT", show_target, "a 32-hex-digit object id, or a name")
      ->type_name("")
      ->required();
  show->add_flag("--json", show_json, "print one JSON object");
  show->add_option("--hexdump", show_hexdump,
                   "also print the first N bytes of data, hexdump -C style")
      ->option_text("N");
  show->callback([&] { result = ShowObject(socket, show_target, show_json, show_hexdump); });

  bool clients_json = false;
  auto* clients = app.add_subcommand("clients", "list the connected clients and what they hold");
  clients->add_flag("--json", clients_json, "print a JSON array of clients");
  clients->callback([&] { result = ListClients(socket, clients_json); });

  std::vector<std::string> verify_targets;
  bool verify_all = false;
  bool verify_json = false;
  auto* verify = app.add_subcommand(
      "verify", "recompute objects' checksums and compare (exit status 1 on any mismatch)");
  verify->add_option("OBJECT", verify_targets, "32-hex-digit object ids or names")->type_name("");
  verify->add_flag("--all", verify_all, "every sealed object that has a checksum");
  verify->add_flag("--json", verify_json, "print one JSON object");
  verify->callback(
      [&] { result = VerifyObjects(socket, verify_targets, verify_all, verify_json); });

  std::string evict_bytes;
  bool evict_all = false;
  bool evict_json = false;
  auto* evict = app.add_subcommand(
      "evict", "evict unreferenced, unpinned objects now, least recently used first");
  evict->add_option("--bytes", evict_bytes, "evict until SIZE is freed (e.g. 512MiB)")
      ->option_text("SIZE");
  evict->add_flag("--all-unreferenced", evict_all, "evict every object that can be");
  evict->add_flag("--json", evict_json, "print one JSON object");
  evict->callback([&] { result = EvictObjects(socket, evict_bytes, evict_all, evict_json); });

  SubmitOptions submit_options;
  auto* submit =
      app.add_subcommand("submit", "run a task on the attached workers; print its outputs");
  submit->add_option("FUNCTION", submit_options.function, "a function a worker registered")
      ->required();
  submit->add_option("INPUT", submit_options.inputs, "input objects: 32-hex-digit ids or names")
      ->type_name("");
  submit->add_option("--args", submit_options.args, "inline arguments, passed as they are")
      ->option_text("TEXT");
  submit->add_option("--outputs", submit_options.outputs, "how many outputs (default 1)")
      ->option_text("N");
  submit
      ->add_option("--resources", submit_options.resources,
                   "what it holds, e.g. GPU=1,CPU=0 or CPU=2,ssd=1 (default CPU=1)")
      ->option_text("LIST");
  submit
      ->add_option("--affinity", submit_options.affinity,
                   "soft: prefer the GPU holding most input bytes; hard: only that GPU")
      ->option_text("soft|hard");
  submit
      ->add_option("--variant", submit_options.variant,
                   "of a function with CPU and GPU variants: which runs (default auto: the "
                   "scheduler chooses)")
      ->option_text("auto|cpu|gpu");
  submit->add_option("--priority", submit_options.priority, "higher runs first (default 0)")
      ->option_text("N");
  submit
      ->add_option("--retries", submit_options.retries,
                   "runs again after its worker died, at most N times (default 1)")
      ->option_text("N");
  submit
      ->add_option("--label", submit_options.label,
                   "what depotctl tasks shows of it (at most 256 bytes)")
      ->option_text("TEXT");
  submit
      ->add_option("--output-bytes", submit_options.output_bytes,
                   "what its outputs take, if known (e.g. 64MiB): it starts only where they fit")
      ->option_text("SIZE");
  submit
      ->add_option("--kind", submit_options.kind,
                   "its kind (at most 256 bytes): with no --output-bytes, its outputs are "
                   "expected as large as the most a task of its kind made so far")
      ->option_text("TEXT");
  submit->add_flag("--wait", submit_options.wait,
                   "wait for the outputs; exit 1 with the task's message if it failed");
  submit->callback([&] { result = SubmitTask(socket, submit_options); });

  bool workers_json = false;
  auto* workers = app.add_subcommand("workers", "list the workers attached and what they run");
  workers->add_flag("--json", workers_json, "print a JSON array of workers");
  workers->callback([&] { result = ListWorkers(socket, workers_json); });

  bool tasks_json = false;
  auto* tasks = app.add_subcommand("tasks", "list pending and recent tasks, where and why");
  tasks->add_flag("--json", tasks_json, "print a JSON array of tasks");
  tasks->callback([&] { result = ListTasks(socket, tasks_json); });

  TopOptions top_options;
  auto* top = app.add_subcommand(
      "top", "a live view of memory, objects, clients and request rates (q quits)");
  top->add_option("--interval", top_options.interval,
                  "seconds between refreshes, fractions allowed (default 1)")
      ->option_text("SECONDS");
  auto* top_once =
      top->add_flag("--once", top_options.once,
                    "print one frame as plain text and exit (what a pipe gets anyway)");
  top->add_option("--iterations", top_options.iterations, "exit after N frames")
      ->option_text("N")
      ->excludes(top_once);
  top->callback([&] { result = ShowTop(socket, top_options); });

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
