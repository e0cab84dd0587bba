// The scheduler from Python: submitting tasks and cancelling them (methods of _depot.Client,
// bound in module.cc), and _depot.Worker, a depot::Worker whose functions are Python
// callables. How Python values become a task's arguments and outputs is depot/_tasks.py's.
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

#include "depot/client.h"

namespace depot::python {

// `tasks`: dicts of TaskRequest's fields by name (function, inputs as 16-byte ids, args as
// bytes, outputs, num_outputs, cpu, gpu, resources, affinity "none"|"soft"|"hard",
// priority, retries, output_bytes, detach). Submits them all or none, with the GIL
// released; returns each task's output ids.
std::vector<std::vector<nanobind::bytes>> Submit(Client& client, nanobind::list tasks);
// One outcome name per id: "cancelled", "running", "finished" or "unknown".
std::vector<std::string> Cancel(Client& client, const std::vector<nanobind::bytes>& outputs);

void BindTasks(nanobind::module_& m);

}  // namespace depot::python
