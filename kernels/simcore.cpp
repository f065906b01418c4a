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
#include "expand.h"

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

// -------------------------------------------------------------------------------------------
// Strategy simulation: a prepared graph (dict of arrays, built once) + an expander + an engine.
template <typename T>
std::vector<T> vec(const py::dict& d, const char* key) {
  if (!d.contains(key)) throw std::invalid_argument(std::string("prepared graph: missing '") + key + "'");
  auto a = py::cast<Arr<T>>(d[key]);
  return std::vector<T>(a.data(), a.data() + a.size());
}

tag_sim::Piecewise piecewise(const py::dict& d, const char* key) {
  tag_sim::Piecewise f;
  if (!d.contains(key) || d[key].is_none()) return f;
  auto seg = py::cast<py::dict>(d[key]);
  f.breaks = vec<double>(seg, "breaks");
  f.slope = vec<double>(seg, "slope");
  f.intercept = vec<double>(seg, "intercept");
  if (f.breaks.size() != f.slope.size() || f.slope.size() != f.intercept.size() || f.slope.empty())
    throw std::invalid_argument(std::string("prepared graph: bad piecewise model '") + key + "'");
  return f;
}

class Simulator {
 public:
  explicit Simulator(const py::dict& d) : expander_(p_) {
    p_.num_ops = py::cast<int32_t>(d["num_ops"]);
    p_.num_groups = py::cast<int32_t>(d["num_groups"]);
    p_.num_devices = py::cast<int32_t>(d["num_devices"]);
    p_.num_types = py::cast<int32_t>(d["num_types"]);
    p_.batch = py::cast<int32_t>(d["batch"]);
    p_.num_links = py::cast<int32_t>(d["num_links"]);
    p_.op_group = vec<int32_t>(d, "op_group");
    p_.op_coloc = vec<int32_t>(d, "op_coloc");
    p_.op_flags = vec<uint8_t>(d, "op_flags");
    p_.op_fixed = vec<double>(d, "op_fixed");
    p_.op_per_sample = vec<double>(d, "op_per_sample");
    p_.op_out_fixed = vec<int64_t>(d, "op_out_fixed");
    p_.op_out_batched = vec<int64_t>(d, "op_out_batched");
    p_.op_persist = vec<int64_t>(d, "op_persist");
    p_.e_src = vec<int32_t>(d, "e_src");
    p_.e_dst = vec<int32_t>(d, "e_dst");
    p_.e_tensor = vec<int32_t>(d, "e_tensor");
    p_.e_bytes = vec<int64_t>(d, "e_bytes");
    p_.e_state = vec<uint8_t>(d, "e_state");
    p_.e_need = vec<uint8_t>(d, "e_need");
    p_.t_level = vec<int32_t>(d, "t_level");
    p_.t_rank = vec<int32_t>(d, "t_rank");
    p_.t_dtype = vec<int32_t>(d, "t_dtype");
    p_.t_bytes = vec<int64_t>(d, "t_bytes");
    p_.t_fusable = vec<uint8_t>(d, "t_fusable");
    p_.c_src = vec<int32_t>(d, "c_src");
    p_.c_dst = vec<int32_t>(d, "c_dst");
    p_.dev_type = vec<int32_t>(d, "dev_type");
    p_.dev_machine = vec<int32_t>(d, "dev_machine");
    p_.dev_host = vec<int32_t>(d, "dev_host");
    if (d.contains("machine_kind")) p_.machine_kind = vec<int32_t>(d, "machine_kind");
    p_.num_hosts = py::cast<int32_t>(d["num_hosts"]);
    p_.dev_capacity = vec<int64_t>(d, "dev_capacity");
    p_.type_mem_bw = vec<double>(d, "type_mem_bw");
    p_.type_launch = vec<double>(d, "type_launch");
    p_.link_res_ptr = vec<int32_t>(d, "link_res_ptr");
    p_.link_res = vec<int32_t>(d, "link_res");
    p_.link_bw = vec<double>(d, "link_bw");
    p_.link_lat = vec<double>(d, "link_lat");
    p_.p2p_intra = piecewise(d, "p2p_intra");
    p_.p2p_inter = piecewise(d, "p2p_inter");
    if (d.contains("host_message_s")) p_.host_message_s = py::cast<double>(d["host_message_s"]);
    if (d.contains("host_message")) p_.host_message = vec<double>(d, "host_message");
    if (d.contains("host_copy")) p_.host_copy = vec<double>(d, "host_copy");
    if (d.contains("host_collective")) p_.host_collective = vec<double>(d, "host_collective");
    if (d.contains("fabric_bw")) p_.fabric_bw = py::cast<double>(d["fabric_bw"]);
    if (d.contains("hierarchical")) p_.hierarchical = py::cast<bool>(d["hierarchical"]);
    if (d.contains("feed_local")) p_.feed_local = py::cast<bool>(d["feed_local"]);
    for (auto [key, fits] : {std::pair{"allreduce_intra", &p_.allreduce_intra},
                             std::pair{"allreduce_inter", &p_.allreduce_inter}}) {
      if (!d.contains(key)) continue;
      for (auto item : py::cast<py::list>(d[key])) {   // index = device count; None = not fitted
        py::dict one;
        if (!item.is_none()) one["m"] = item;
        fits->push_back(piecewise(one, "m"));
      }
    }
    check();
    // The first device pair that holds each link, and where in that pair's list (collapsed runs
    // report a link that was not simulated from the same link of the representatives' pair).
    const int64_t D = p_.num_devices;
    link_pair_.assign(p_.num_links, -1);
    link_at_.assign(p_.num_links, 0);
    for (int64_t pair = 0; pair < D * D; ++pair)
      for (int32_t k = p_.link_res_ptr[pair]; k < p_.link_res_ptr[pair + 1]; ++k)
        if (link_pair_[p_.link_res[k]] < 0) {
          link_pair_[p_.link_res[k]] = pair;
          link_at_[p_.link_res[k]] = k - p_.link_res_ptr[pair];
        }
  }

  // Expand and simulate one strategy. Returns a dict (see tag_tf/sim/simulator.py).
  py::dict run(Arr<int32_t> grp_ptr, Arr<int32_t> grp_devs, Arr<uint8_t> grp_option, py::object shares,
               py::object mp_part, int64_t fusion_bytes, bool sync_after_backward, py::object op_dup,
               bool with_tasks, bool collapse, int32_t microbatches) {
    if (grp_ptr.size() != p_.num_groups + 1 || grp_option.size() != p_.num_groups)
      throw std::invalid_argument("strategy: expected one device list and option per group");
    if (grp_ptr.data()[p_.num_groups] != grp_devs.size() || grp_ptr.data()[0] != 0)
      throw std::invalid_argument("strategy: grp_ptr does not match grp_devs");
    std::vector<double> sh;
    std::vector<int32_t> mp;
    std::vector<uint8_t> dup;
    tag_sim::StrategyView s;
    s.grp_ptr = grp_ptr.data();
    s.grp_devs = grp_devs.data();
    s.grp_option = grp_option.data();
    if (fusion_bytes < 0) throw std::invalid_argument("strategy: fusion_bytes must be >= 0");
    s.fusion_bytes = fusion_bytes;
    s.sync_after_backward = sync_after_backward;
    if (microbatches < 1) throw std::invalid_argument("strategy: microbatches must be >= 1");
    s.microbatches = microbatches;
    if (!shares.is_none()) {
      auto a = py::cast<Arr<double>>(shares);
      if (a.size() != p_.num_devices) throw std::invalid_argument("strategy: one share per device");
      sh.assign(a.data(), a.data() + a.size());
      s.shares = sh.data();
    }
    if (!mp_part.is_none()) {
      auto a = py::cast<Arr<int32_t>>(mp_part);
      if (a.size() != p_.num_ops) throw std::invalid_argument("strategy: mp_part needs one entry per op");
      mp.assign(a.data(), a.data() + a.size());
      s.mp_part = mp.data();
    }
    if (!op_dup.is_none()) {
      auto a = py::cast<Arr<uint8_t>>(op_dup);
      if (a.size() != p_.num_ops) throw std::invalid_argument("strategy: op_dup needs one entry per op");
      dup.assign(a.data(), a.data() + a.size());
      s.op_dup = dup.data();
    }
    std::string err;
    tag_sim::Status status = tag_sim::Status::kOk;
    {
      py::gil_scoped_release nogil;
      err = expander_.expand(s, graph_, &meta_, collapse);
      if (err.empty()) status = engine_.run(graph_.view());
    }
    if (!err.empty()) throw py::value_error(err);
    if (status != tag_sim::Status::kOk) throw std::runtime_error("internal: expanded task graph has a cycle");
    return summary(with_tasks);
  }

 private:
  tag_sim::Prepared p_;
  tag_sim::Expander expander_;
  tag_sim::Engine engine_;
  tag_sim::TaskGraph graph_;
  tag_sim::TaskMeta meta_;
  std::vector<int64_t> link_pair_;
  std::vector<int32_t> link_at_;

  void check() const {
    const size_t N = p_.num_ops, D = p_.num_devices, T = p_.num_types;
    auto need = [](bool ok, const char* what) {
      if (!ok) throw std::invalid_argument(std::string("prepared graph: ") + what);
    };
    need(p_.op_group.size() == N && p_.op_coloc.size() == N && p_.op_flags.size() == N, "op arrays length");
    need(p_.op_fixed.size() == T * N && p_.op_per_sample.size() == T * N, "op cost arrays must be [types * ops]");
    need(p_.op_out_fixed.size() == N && p_.op_out_batched.size() == N && p_.op_persist.size() == N, "op byte arrays");
    const size_t E = p_.e_src.size();
    need(p_.e_dst.size() == E && p_.e_tensor.size() == E && p_.e_bytes.size() == E && p_.e_state.size() == E &&
             p_.e_need.size() == E, "edge arrays length");
    need(p_.c_dst.size() == p_.c_src.size(), "control edge arrays length");
    const size_t T_ = p_.t_level.size();
    need(p_.t_rank.size() == T_ && p_.t_dtype.size() == T_ && p_.t_bytes.size() == T_ && p_.t_fusable.size() == T_,
         "tensor arrays length");
    for (int32_t t : p_.e_tensor) need(t >= 0 && static_cast<size_t>(t) < T_, "e_tensor out of range");
    need(p_.dev_type.size() == D && p_.dev_machine.size() == D && p_.dev_capacity.size() == D &&
             p_.dev_host.size() == D, "device arrays");
    for (int32_t h : p_.dev_host) need(h >= -1 && h < p_.num_hosts, "dev_host out of range");
    if (!p_.machine_kind.empty()) {
      int32_t machines = 0;
      for (int32_t m : p_.dev_machine) {
        need(m >= 0, "dev_machine out of range");
        machines = std::max(machines, m + 1);
      }
      need(p_.machine_kind.size() == static_cast<size_t>(machines), "machine_kind: one entry per machine");
    }
    need(p_.type_mem_bw.size() == T && p_.type_launch.size() == T, "device type arrays");
    need(std::isfinite(p_.host_message_s) && p_.host_message_s >= 0, "host_message_s must be finite and >= 0");
    need(p_.host_message.empty() || p_.host_message.size() == static_cast<size_t>(p_.num_hosts),
         "host_message: one per host");
    for (double m : p_.host_message) need(std::isfinite(m) && m >= 0, "host_message must be finite and >= 0");
    need(p_.host_copy.empty() || p_.host_copy.size() == static_cast<size_t>(p_.num_hosts), "host_copy: one per host");
    for (double c : p_.host_copy) need(std::isfinite(c) && c >= 0, "host_copy must be finite and >= 0");
    need(p_.host_collective.empty() || p_.host_collective.size() == static_cast<size_t>(p_.num_hosts),
         "host_collective: one per host");
    for (double c : p_.host_collective) need(std::isfinite(c) && c >= 0, "host_collective must be finite and >= 0");
    need(p_.link_res_ptr.size() == D * D + 1 && p_.link_bw.size() == D * D && p_.link_lat.size() == D * D, "link arrays");
    for (int32_t g : p_.op_group) need(g >= 0 && g < p_.num_groups, "op_group out of range");
    for (size_t e = 0; e < E; ++e)
      need(p_.e_src[e] >= 0 && p_.e_src[e] < p_.num_ops && p_.e_dst[e] >= 0 && p_.e_dst[e] < p_.num_ops,
           "edge endpoint out of range");
    for (size_t k = 0; k < p_.c_src.size(); ++k)
      need(p_.c_src[k] >= 0 && p_.c_src[k] < p_.num_ops && p_.c_dst[k] >= 0 && p_.c_dst[k] < p_.num_ops,
           "control edge endpoint out of range");
    for (int32_t t : p_.dev_type) need(t >= 0 && t < p_.num_types, "dev_type out of range");
    for (int32_t r : p_.link_res) need(r >= 0 && r < p_.num_links, "link resource out of range");
    for (double b : p_.link_bw) need(b > 0, "link bandwidth must be positive");
    for (double b : p_.type_mem_bw) need(b > 0, "memory bandwidth must be positive");
  }

  py::dict summary(bool with_tasks) const {
    const int32_t G = p_.num_groups;
    const size_t n = graph_.duration.size();
    const auto& start = engine_.start();
    const auto& end = engine_.end();
    // Runtime-feedback features per op group: span of its compute tasks, and the mean wait between
    // an output becoming ready and its transfer starting.
    std::vector<double> gstart(G, INFINITY), gend(G, 0.0), gwait(G, 0.0), gbusy(G, 0.0);
    std::vector<int32_t> gsent(G, 0);
    // A simulated device stands for its class (expand.h): its instances count once per member.
    for (size_t i = 0; i < n; ++i) {
      const int32_t op = meta_.op[i];
      if (op < 0) continue;
      const int32_t g = p_.op_group[op];
      const int32_t dev = meta_.device[i];
      const int32_t times = dev >= 0 ? expander_.multiplicity(dev) : 1;
      if (meta_.kind[i] == tag_sim::kCompute) {
        gstart[g] = std::min(gstart[g], start[i]);
        gend[g] = std::max(gend[g], end[i]);
        gbusy[g] += graph_.duration[i] * times;
      } else if (meta_.kind[i] == tag_sim::kTransfer && meta_.src[i] >= 0 &&
                 meta_.kind[meta_.src[i]] == tag_sim::kCompute) {
        gwait[g] += (start[i] - end[meta_.src[i]]) * times;
        gsent[g] += times;
      }
    }
    for (int32_t g = 0; g < G; ++g) {
      if (gsent[g]) gwait[g] /= gsent[g];
      if (!std::isfinite(gstart[g])) gstart[g] = 0.0;
    }
    // Per-device and per-link results of devices and links that were not simulated: their
    // representative's (a link: the same link of the representatives' pair).
    const int32_t D = p_.num_devices;
    std::vector<int64_t> peak(engine_.peak_bytes());
    std::vector<uint8_t> oom(engine_.oom());
    std::vector<double> busy(engine_.busy());
    for (int32_t d = 0; d < D; ++d) {
      const int32_t r = expander_.rep_of(d);
      if (r == d) continue;
      peak[d] = peak[r];
      oom[d] = oom[r];
      busy[d] = busy[r];
      busy[D + d] = busy[D + r];
    }
    if (expander_.num_simulated() < D)
      for (int32_t link = 0; link < p_.num_links; ++link) {
        if (expander_.link_simulated(link) || link_pair_[link] < 0) continue;
        const int64_t pair = link_pair_[link];
        const int32_t ra = expander_.rep_of(static_cast<int32_t>(pair / D));
        const int32_t rb = expander_.rep_of(static_cast<int32_t>(pair % D));
        const size_t rpair = static_cast<size_t>(ra) * D + rb;
        const int32_t width = p_.link_res_ptr[pair + 1] - p_.link_res_ptr[pair];
        const bool same = ra != rb && p_.link_res_ptr[rpair + 1] - p_.link_res_ptr[rpair] == width;
        busy[2 * D + link] = same ? busy[2 * D + p_.link_res[p_.link_res_ptr[rpair] + link_at_[link]]] : 0.0;
      }
    py::dict out;
    out["makespan"] = engine_.makespan();
    out["num_tasks"] = static_cast<int64_t>(n);
    out["devices_simulated"] = expander_.num_simulated();
    out["exact"] = expander_.exact();
    out["peak_bytes"] = to_numpy(peak);
    out["persistent_bytes"] = to_numpy(graph_.persistent_bytes);
    out["oom"] = to_numpy(oom);
    out["busy"] = to_numpy(busy);
    out["group_start"] = to_numpy(gstart);
    out["group_end"] = to_numpy(gend);
    out["group_busy"] = to_numpy(gbusy);
    out["group_out_wait"] = to_numpy(gwait);
    py::dict conv;
    conv["split"] = expander_.num_splits;
    conv["concat"] = expander_.num_concats;
    conv["addn"] = expander_.num_addns;
    conv["addn_tensors"] = expander_.num_addn_tensors;
    conv["allreduce"] = expander_.num_allreduces;
    conv["allreduce_tensors"] = expander_.num_allreduce_tensors;
    conv["transfer"] = expander_.num_transfers;
    conv["zeros"] = expander_.num_zeros;
    conv["accumulate"] = expander_.num_accumulates;
    out["conversions"] = conv;
    std::vector<int32_t> op_layout_size(p_.num_ops);
    for (int32_t op = 0; op < p_.num_ops; ++op) op_layout_size[op] = expander_.layout(expander_.layout_of(op)).size();
    out["op_instances"] = to_numpy(op_layout_size);
    if (with_tasks) {
      out["duration"] = to_numpy(graph_.duration);
      out["start"] = to_numpy(start);
      out["end"] = to_numpy(end);
      out["res_ptr"] = to_numpy(graph_.res_ptr);
      out["res"] = to_numpy(graph_.res);
      out["succ_ptr"] = to_numpy(graph_.succ_ptr);
      out["succ"] = to_numpy(graph_.succ);
      out["succ_data"] = to_numpy(graph_.succ_data);
      out["mem_device"] = to_numpy(graph_.mem_device);
      out["mem_bytes"] = to_numpy(graph_.mem_bytes);
      out["capacity_bytes"] = to_numpy(graph_.capacity_bytes);
      out["kind"] = to_numpy(meta_.kind);
      out["op"] = to_numpy(meta_.op);
      out["device"] = to_numpy(meta_.device);
      out["src"] = to_numpy(meta_.src);
      out["num_resources"] = graph_.num_resources;
    }
    return out;
  }
};

}  // namespace

PYBIND11_MODULE(_simcore, m) {
  m.doc() = "tag_tf native simulator core (discrete-event engine, see kernels/engine.h)";
  m.attr("ABI_VERSION") = 8;

  py::class_<Simulator>(m, "Simulator", "A prepared graph + topology: expand and simulate strategies.")
      .def(py::init<const py::dict&>(), py::arg("prepared"))
      .def("run", &Simulator::run, py::arg("grp_ptr").noconvert(), py::arg("grp_devs").noconvert(),
           py::arg("grp_option").noconvert(), py::arg("shares"), py::arg("mp_part"), py::arg("fusion_bytes") = 0,
           py::arg("sync_after_backward") = false, py::arg("op_dup") = py::none(), py::arg("with_tasks") = false,
           py::arg("collapse") = false, py::arg("microbatches") = 1,
           "Expand a strategy into tasks and simulate one iteration; returns a summary dict.");

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
