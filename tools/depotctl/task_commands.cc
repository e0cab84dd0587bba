// depotctl's task commands: submit, workers, tasks.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <iostream>
#include <map>
#include <sstream>

#include "commands.h"
#include "depot/ipc/units.h"
#include "format.h"
#include "json_fields.h"

namespace depot::ctl {

namespace {

using ipc::FormatSeconds;

// "GPU=1,CPU=0,ssd=1": CPU and GPU (any case) set the task's slots and share; other names
// are custom resources.
Status ParseResources(const std::string& text, TaskRequest& task) {
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    double amount = 0;
    size_t used = 0;
    try {
      if (eq == std::string::npos || eq == 0) throw std::invalid_argument(item);
      amount = std::stod(item.substr(eq + 1), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() - eq - 1 || !std::isfinite(amount)) {
      return Status::InvalidArgument("--resources wants NAME=AMOUNT,... (e.g. GPU=1,CPU=0), not '" +
                                     Printable(item) + "'");
    }
    std::string name = item.substr(0, eq);
    std::string upper = name;
    std::transform(upper.begin(), upper.end(), upper.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    if (upper == "CPU") {
      task.cpu = amount;
    } else if (upper == "GPU") {
      task.gpu = amount;
    } else {
      task.resources[name] = amount;
    }
  }
  return Status::OK();
}

std::string FormatShare(double share) {
  std::ostringstream out;
  out << share;
  return out.str();
}

std::string DeviceName(int device) { return device < 0 ? "host" : "gpu" + std::to_string(device); }

std::string ResourcesText(const std::map<std::string, double>& resources) {
  std::string out;
  for (const auto& [name, amount] : resources) {
    out += (out.empty() ? "" : ",") + Printable(name) + "=" + FormatShare(amount);
  }
  return out.empty() ? "-" : out;
}

// A worker as its table writes it, with its GPUs as one list of {device, free_share} (the
// table has two lists side by side, gpus and free_gpu_shares, as the wire does), and
// gpu_functions after functions, as depotctl wrote them before the table.
std::string WorkerJson(const WorkerInfo& w) {
  std::string gpus = "[";
  for (size_t k = 0; k < w.gpus.size(); ++k) {
    const double free_share = FreeShare(w, k);
    gpus += (k == 0 ? "" : ", ") + JsonObject()
                                       .Number("device", static_cast<uint64_t>(w.gpus[k]))
                                       .Real("free_share", free_share)
                                       .str();
  }
  return JsonOf(w)
      .Json("gpus", gpus + "]")
      .Remove("free_gpu_shares")
      .MoveBefore("gpu_functions", "running")
      .str();
}

// A task as its table writes it, with its device null while it has none (on the host, or
// not placed yet) rather than the table's -1, as before the table.
std::string TaskJson(const TaskInfo& t) {
  JsonObject json = JsonOf(t);
  if (t.device < 0) json.Null("device");
  return json.str();
}

}  // namespace

Status SubmitTask(const std::string& socket, const SubmitOptions& options) {
  TaskRequest task;
  task.function = options.function;
  for (const std::string& input : options.inputs) task.inputs.push_back(ParseTarget(input).id);
  task.args = options.args;
  task.num_outputs = options.outputs;
  DEPOT_RETURN_NOT_OK(ParseResources(options.resources, task));
  if (options.affinity == "soft") {
    task.affinity = Affinity::kSoft;
  } else if (options.affinity == "hard") {
    task.affinity = Affinity::kHard;
  } else if (!options.affinity.empty() && options.affinity != "none") {
    return Status::InvalidArgument("--affinity is none, soft or hard, not '" +
                                   Printable(options.affinity) + "'");
  }
  if (options.variant == "cpu") {
    task.variant = Variant::kCpu;
  } else if (options.variant == "gpu") {
    task.variant = Variant::kGpu;
  } else if (!options.variant.empty() && options.variant != "auto") {
    return Status::InvalidArgument("--variant is auto, cpu or gpu, not '" +
                                   Printable(options.variant) + "'");
  }
  task.priority = options.priority;
  task.retries = options.retries;
  task.label = options.label;
  if (!options.output_bytes.empty()) {
    Result<uint64_t> bytes = ipc::ParseSize(options.output_bytes);
    if (!bytes.ok()) return Status::InvalidArgument("--output-bytes: " + bytes.status().message());
    task.output_bytes = *bytes;
  }
  task.kind = options.kind;
  // depotctl leaves at once unless it waits: the task must outlive it.
  task.detach = !options.wait;
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  DEPOT_ASSIGN_OR_RETURN(std::vector<ObjectId> outputs, client.Submit(task));
  for (const ObjectId& id : outputs) std::cout << id.Hex() << '\n';
  std::cout.flush();
  if (!options.wait) return Status::OK();
  DEPOT_ASSIGN_OR_RETURN(std::vector<Buffer> done, client.Get(outputs, kForever));
  for (size_t i = 0; i < done.size(); ++i) {
    if (!done[i]) return Status::NotFound("output " + outputs[i].Hex() + " went missing");
  }
  return Status::OK();
}

Status ListWorkers(const std::string& socket, bool json) {
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  DEPOT_ASSIGN_OR_RETURN(std::vector<WorkerInfo> workers, client.Workers());
  if (json) {
    std::cout << '[';
    for (size_t i = 0; i < workers.size(); ++i) {
      std::cout << (i == 0 ? "\n  " : ",\n  ") << WorkerJson(workers[i]);
    }
    std::cout << (workers.empty() ? "]\n" : "\n]\n");
    return Status::OK();
  }
  using Align = Table::Align;
  Table table({{"SESSION", Align::kRight},
               {"NAME"},
               {"CPUS", Align::kRight},
               {"GPUS"},
               {"RESOURCES"},
               {"RUNNING", Align::kRight},
               {"QUEUED", Align::kRight},
               {"DONE", Align::kRight},
               {"FAILED", Align::kRight},
               {"RATE", Align::kRight},
               {"FUNCTIONS"}});
  for (const WorkerInfo& w : workers) {
    std::string gpus;
    for (size_t k = 0; k < w.gpus.size(); ++k) {
      gpus += (gpus.empty() ? "" : " ") + DeviceName(w.gpus[k]) + ":" +
              FormatShare(1 - FreeShare(w, k)) + "/1";
    }
    // Each name once: "f" runs as registered, "f(cpu,gpu)" has two variants, "f(gpu)" only
    // a GPU one.
    std::map<std::string, std::string> variants;
    for (const std::string& f : w.functions) variants[f];
    for (const std::string& f : w.gpu_functions) {
      const bool cpu = std::find(w.functions.begin(), w.functions.end(), f) != w.functions.end();
      variants[f] = cpu ? "(cpu,gpu)" : "(gpu)";
    }
    std::string functions;
    for (const auto& [f, which] : variants) functions += (functions.empty() ? "" : ",") + f + which;
    const double rate = w.attached_s > 0 ? static_cast<double>(w.done) / w.attached_s : 0;
    std::ostringstream rate_text;
    rate_text.precision(3);
    rate_text << rate << "/s";
    table.AddRow(
        {std::to_string(w.session_id), Printable(w.name) + (w.draining ? " (draining)" : ""),
         FormatShare(w.cpus - w.free_cpus) + "/" + FormatShare(w.cpus), gpus.empty() ? "-" : gpus,
         ResourcesText(w.resources), std::to_string(w.running), std::to_string(w.queued),
         std::to_string(w.done), std::to_string(w.failed), rate_text.str(), Printable(functions)});
  }
  table.Print(std::cout);
  return Status::OK();
}

Status ListTasks(const std::string& socket, bool json) {
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  DEPOT_ASSIGN_OR_RETURN(std::vector<TaskInfo> tasks, client.Tasks());
  if (json) {
    std::cout << '[';
    for (size_t i = 0; i < tasks.size(); ++i) {
      std::cout << (i == 0 ? "\n  " : ",\n  ") << TaskJson(tasks[i]);
    }
    std::cout << (tasks.empty() ? "]\n" : "\n]\n");
    return Status::OK();
  }
  using Align = Table::Align;
  Table table({{"TASK", Align::kRight},
               {"FUNCTION"},
               {"LABEL"},
               {"STATE"},
               {"WORKER", Align::kRight},
               {"DEVICE"},
               {"VARIANT"},
               {"TRIES", Align::kRight},
               {"LOCAL", Align::kRight},
               {"MOVED", Align::kRight},
               {"ESTIMATE"},
               {"OUTPUT"},
               {"WHY"}});
  for (const TaskInfo& t : tasks) {
    const bool placed = t.worker != 0;
    table.AddRow(
        {std::to_string(t.task), Printable(t.function),
         t.label.empty() ? "-" : Printable(FitWidth(t.label, 40)), TaskStateName(t.state),
         placed ? std::to_string(t.worker) : "-", placed ? DeviceName(t.device) : "-",
         t.variant.empty() ? "-" : Printable(t.variant), std::to_string(t.attempts),
         placed ? ipc::FormatSize(t.local_bytes) : "-",
         placed ? ipc::FormatSize(t.moved_bytes) : "-",
         placed ? FormatSeconds(t.wait_s) + "+" + FormatSeconds(t.transfer_s) + "+" +
                      FormatSeconds(t.duration_s)
                : "-",
         t.outputs.empty() ? "-" : t.outputs[0].Hex() + (t.outputs.size() > 1 ? " ..." : ""),
         !t.reason.empty()                ? Printable(FitWidth(t.reason, 60))
         : t.state == TaskState::kWaiting ? std::to_string(t.inputs_missing) + " inputs to come"
                                          : Printable(FitWidth(t.variant_reason, 60))});
  }
  table.Print(std::cout);
  return Status::OK();
}

}  // namespace depot::ctl
