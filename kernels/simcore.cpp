// Native simulator core for tag_tf (see tag_tf/sim). Built by setup.py as tag_tf._simcore.
// Thin pybind11 layer over kernels/engine.h: arrays are borrowed zero-copy (exact dtype and
// C-contiguity are required, no silent conversion), results are copied out into fresh arrays.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "engine.h"

namespace py = pybind11;

namespace {

template <typename T>
using Arr = py::array_t<T, py::array::c_style>;

// Graph arrays as received from Python; kept together so that every entry point checks them alike.
struct PyGraph {
  Arr<double> duration;
  Arr<int32_t> res_ptr, res, succ_ptr, succ;
  Arr<uint8_t> succ_data;
  Arr<int32_t> mem_device;
  Arr<int64_t> mem_bytes, persistent_bytes, capacity_bytes;
  int64_t num_resources;

  // The O(1) size checks are always done: they are what keeps even an unvalidated call in bounds
  // for the CSR pointers' first/last entries. Per-entry checks are tag_sim::validate's job.
  tag_sim::GraphView view() const {
    auto need = [](const char* name, const py::array& a, int64_t size) {
      if (a.ndim() != 1 || a.shape(0) != size)
        throw std::invalid_argument(std::string(name) + ": expected a 1-D array of length " + std::to_string(size) +
                                    ", got shape of size " + std::to_string(a.size()));
    };
    const int64_t n = duration.ndim() == 1 ? duration.shape(0) : -1;
    if (n < 0) throw std::invalid_argument("duration: expected a 1-D array");
    if (n > INT32_MAX - 1) throw std::invalid_argument("duration: too many tasks for int32 ids");
    if (num_resources < 0 || num_resources > INT32_MAX) throw std::invalid_argument("num_resources out of range");
    need("res_ptr", res_ptr, n + 1);
    need("succ_ptr", succ_ptr, n + 1);
    need("mem_device", mem_device, n);
    need("mem_bytes", mem_bytes, n);
    need("succ_data", succ_data, succ.size());
    need("capacity_bytes", capacity_bytes, persistent_bytes.size());
    if (res.ndim() != 1 || succ.ndim() != 1 || persistent_bytes.ndim() != 1)
      throw std::invalid_argument("res, succ, persistent_bytes: expected 1-D arrays");
    tag_sim::GraphView g;
    g.num_tasks = static_cast<int32_t>(n);
    g.num_resources = static_cast<int32_t>(num_resources);
    g.num_pools = static_cast<int32_t>(persistent_bytes.size());
    g.duration = duration.data();
    g.res_ptr = res_ptr.data();
    g.res = res.data();
    g.res_len = res.size();
    g.succ_ptr = succ_ptr.data();
    g.succ = succ.data();
    g.succ_data = succ_data.data();
    g.succ_len = succ.size();
    g.mem_device = mem_device.data();
    g.mem_bytes = mem_bytes.data();
    g.persistent_bytes = persistent_bytes.data();
    g.capacity_bytes = capacity_bytes.data();
    return g;
  }
};

template <typename T>
py::array_t<T> to_numpy(const std::vector<T>& v) {
  py::array_t<T> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

// The graph arguments, in the order of tag_tf.sim.engine.TaskGraph.native_args().
#define GRAPH_ARGS                                                                                             \
  py::arg("duration").noconvert(), py::arg("res_ptr").noconvert(), py::arg("res").noconvert(),                \
      py::arg("succ_ptr").noconvert(), py::arg("succ").noconvert(), py::arg("succ_data").noconvert(),         \
      py::arg("mem_device").noconvert(), py::arg("mem_bytes").noconvert(),                                      \
      py::arg("persistent_bytes").noconvert(), py::arg("capacity_bytes").noconvert(), py::arg("num_resources")

#define GRAPH_PARAMS                                                                                     \
  Arr<double> duration, Arr<int32_t> res_ptr, Arr<int32_t> res, Arr<int32_t> succ_ptr, Arr<int32_t> succ, \
      Arr<uint8_t> succ_data, Arr<int32_t> mem_device, Arr<int64_t> mem_bytes, Arr<int64_t> persistent_bytes, \
      Arr<int64_t> capacity_bytes, int64_t num_resources

#define GRAPH_STRUCT                                                                                    \
  PyGraph {                                                                                             \
    duration, res_ptr, res, succ_ptr, succ, succ_data, mem_device, mem_bytes, persistent_bytes,         \
        capacity_bytes, num_resources                                                                   \
  }

}  // namespace

PYBIND11_MODULE(_simcore, m) {
  m.doc() = "tag_tf native simulator core (discrete-event engine, see kernels/engine.h)";
  m.attr("ABI_VERSION") = 2;

  m.def(
      "validate",
      [](GRAPH_PARAMS) -> std::string {
        const PyGraph pg = GRAPH_STRUCT;
        const tag_sim::GraphView g = pg.view();
        py::gil_scoped_release nogil;
        return tag_sim::validate(g);
      },
      GRAPH_ARGS, "Empty string if the graph is valid, else one line naming the bad array and index.");

  m.def(
      "find_cycle",
      [](GRAPH_PARAMS) -> std::vector<int32_t> {
        const PyGraph pg = GRAPH_STRUCT;
        const tag_sim::GraphView g = pg.view();
        py::gil_scoped_release nogil;
        return tag_sim::find_cycle(g);
      },
      GRAPH_ARGS, "Task ids of one cycle in edge order, or [] if the graph is acyclic.");

  py::class_<tag_sim::Engine>(m, "Engine", "Reusable engine; results of the last run are read with the getters.")
      .def(py::init<>())
      .def(
          "run",
          [](tag_sim::Engine& self, GRAPH_PARAMS, bool check) -> bool {
            const PyGraph pg = GRAPH_STRUCT;
            const tag_sim::GraphView g = pg.view();
            py::gil_scoped_release nogil;
            if (check) {
              std::string err = tag_sim::validate(g);
              if (!err.empty()) {
                py::gil_scoped_acquire gil;
                throw py::value_error(err);
              }
            }
            return self.run(g) == tag_sim::Status::kOk;
          },
          GRAPH_ARGS, py::arg("check") = true,
          "Simulate; True if every task ran, False if some never became ready (cycle). check=False skips "
          "the O(n) validation (only for graphs already validated).")
      .def(
          "copy_times",
          [](const tag_sim::Engine& e, py::array_t<double, py::array::c_style> out) {
            const auto n = static_cast<py::ssize_t>(e.start().size());
            if (out.ndim() != 2 || out.shape(0) != 4 || out.shape(1) != n)
              throw std::invalid_argument("copy_times: expected a writable C-contiguous float64 array of shape (4, " +
                                          std::to_string(n) + ")");
            double* dst = out.mutable_data();
            for (const auto* v : {&e.start(), &e.end(), &e.ready(), &e.free_time()}) {
              std::copy(v->begin(), v->end(), dst);
              dst += n;
            }
          },
          py::arg("out").noconvert(),
          "Copy start, end, ready, free_time of the last run into the rows of `out` (shape (4, n)): lets "
          "the caller reuse one block instead of faulting in fresh pages every run.")
      .def("start", [](const tag_sim::Engine& e) { return to_numpy(e.start()); })
      .def("end", [](const tag_sim::Engine& e) { return to_numpy(e.end()); })
      .def("ready", [](const tag_sim::Engine& e) { return to_numpy(e.ready()); })
      .def("free_time", [](const tag_sim::Engine& e) { return to_numpy(e.free_time()); })
      .def("busy", [](const tag_sim::Engine& e) { return to_numpy(e.busy()); })
      .def("peak_bytes", [](const tag_sim::Engine& e) { return to_numpy(e.peak_bytes()); })
      .def("peak_time", [](const tag_sim::Engine& e) { return to_numpy(e.peak_time()); })
      .def("oom", [](const tag_sim::Engine& e) {
        py::array_t<bool> out(static_cast<py::ssize_t>(e.oom().size()));
        for (size_t i = 0; i < e.oom().size(); ++i) out.mutable_data()[i] = e.oom()[i] != 0;
        return out;
      })
      .def_property_readonly("makespan", &tag_sim::Engine::makespan)
      .def_property_readonly("num_finished", &tag_sim::Engine::num_finished);
}
