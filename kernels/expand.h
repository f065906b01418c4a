// Strategy expansion: (prepared graph, strategy) -> task graph for the engine (engine.h).
//
// This is the simulator's mirror of tag_tf/compiler/builder.py. The compiler emits op instances per
// layout and inserts a conversion wherever a producer's state differs from what the consumer needs;
// the expander emits the same instances as compute tasks and the same conversions as tasks:
//
//   need \ have  split (same shards)  split (other)       partial             full               local
//   split        direct               Concat, SplitV      -                   SplitV at source    free
//   partial      direct (same devs)   -                   -                   replica 0, zeros elsewhere
//   full         Concat               Concat              AllReduce or AddN   copy (transfer)     free
//   local        direct (same shards) free                -                   free
//
// LOCAL values (shapes, row offsets) are small integer computations the compiler recomputes per
// layout: they are modelled as free. Transfers are memoised per (source task, device) like TF's
// Send/Recv pairs, conversions per tensor like the compiler's memo table.
//
// All-reduces are decided last, as in the compiler: a request returns a placeholder, and
// `emit_collectives` packs the requests into buckets by tag_tf/placement/fusion.py's rule (same
// devices, dtype and sync level, production order, at most `fusion_bytes` each), emits per bucket
// a pack (concat) per device, one collective and an unpack (split) per device, and chains the
// collectives per device in bucket order (the compiler's control edges). Sums on one device (PS)
// are bucketed by the same rule before the data edges are wired (`plan_sums`, which predicts the
// compiler's AddN requests from the layouts): each replica packs its pieces, sends one tensor, the
// packs are added and split on the summing device.
//
// Resources: [0, D) device compute queues, [D, 2D) per-device collective streams, [2D, 2D+L) links,
// [2D+L, 2D+L+H) host executors: a CPU device's compute tasks hold executor dev_host[d] when >= 0
// (the devices of one process share its executor threads, or every CPU device one executor, or
// none: the Python side's cpu_executor mode); GPUs never do.
// Memory pools: one per device.
//
// Device classes (collapse). Devices a strategy treats alike on machines the topology treats alike
// behave alike: same type, same layouts with the same sample counts, none of them a layout's
// first device or a single device's, no shared host executor, and machines of one kind holding the
// same mix of such devices (a switch topology: swapping those machines is a symmetry). Each class
// is simulated once, on its lowest device (its representative), and stands for all its members:
//   * collectives keep their full member list (durations are analytical) and hold the streams of
//     the simulated members and the links a simulated task can also hold;
//   * a transfer between a representative and another device stands for the transfers of every
//     member pair of the two classes: it lasts as long as the busiest of its links is held by them
//     (k pieces through one NIC: k times one piece), so a representative's input arrives when its
//     class's last one does;
//   * per-device results (memory, idle time) are the representative's.
// Plans that treat every device alike cost what their distinct classes cost, not the device count.
// `collapse = false` expands every device (traces, and the tests that compare both).
//
// Pipelined plans (microbatches M > 1; tag_tf/placement/layout.py, same rules): a group's ops run
// as M micro-batches, a replicated layout listing each device M times (replica m * k + i is
// micro-batch m on the i-th device); variables and the ops writing them (kKeepsState) keep the
// group's layout without micro-batches. A stage hands micro-batch m's piece to the next stage's replica m (`lines_up`), or
// regroups each micro-batch's pieces on their own (`split_by_microbatch`); partial sums are first
// added per device (`device_sum`) and then synchronised over the distinct devices (`uniq`); on each
// device a stage's forward pass of micro-batch m waits for that of m - 1 (`gate_microbatches`, the
// compiler's gates). Such plans are expanded device by device (no classes).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine.h"

namespace tag_sim {

enum : uint8_t { kFull = 0, kSplit = 1, kPartial = 2, kLocal = 3 };              // tensor states
enum : uint8_t { kAllReduce = 0, kPS = 1, kDuplicate = 2, kModelParallel = 3 };  // group options
enum : uint8_t { kSingle = 0, kReplicated = 1, kDuplicated = 2 };                // layout modes
enum : uint8_t { kSource = 1, kVariableSide = 2, kKeepsState = 4, kForward = 8 };  // op flags
enum : uint8_t { kCompute = 0, kTransfer = 1, kSplitTask = 2, kConcat = 3, kAddN = 4, kCollective = 5,
                 kZeros = 6, kPack = 7, kUnpack = 8 };                            // task kinds

// Piecewise-linear time model t(bytes) (fitted communication profiles); empty = not fitted.
struct Piecewise {
  std::vector<double> breaks;      // segment k covers [breaks[k], breaks[k+1]); breaks[0] = 0
  std::vector<double> slope, intercept;
  bool empty() const { return slope.empty(); }
  double operator()(double bytes) const {
    size_t k = static_cast<size_t>(std::upper_bound(breaks.begin(), breaks.end(), bytes) - breaks.begin());
    k = k == 0 ? 0 : std::min(k - 1, slope.size() - 1);
    return std::max(0.0, intercept[k] + slope[k] * bytes);
  }
};

// Everything that depends only on the graph, costs and topology: built once, reused per strategy.
struct Prepared {
  int32_t num_ops = 0, num_groups = 0, num_devices = 0, num_types = 0, batch = 1;
  // Planned ops.
  std::vector<int32_t> op_group, op_coloc;     // group; colocation set id (PS: one server per set)
  std::vector<uint8_t> op_flags;
  std::vector<double> op_fixed, op_per_sample;  // [type * num_ops + op], seconds
  std::vector<int64_t> op_out_fixed, op_out_batched, op_persist;
  // Data edges: one per (tensor, consuming planned op).
  std::vector<int32_t> e_src, e_dst, e_tensor;
  std::vector<int64_t> e_bytes;                 // whole tensor at the planning batch size
  std::vector<uint8_t> e_state, e_need;         // producer state / consumer requirement (replicated)
  // Per tensor id (fusion facts, tag_tf/placement/fusion.py): sync level, production rank, dtype
  // code, bytes, and whether a static shape lets it join a bucket.
  std::vector<int32_t> t_level, t_rank, t_dtype;
  std::vector<int64_t> t_bytes;
  std::vector<uint8_t> t_fusable;
  // Control edges between planned ops.
  std::vector<int32_t> c_src, c_dst;
  // Devices and links.
  std::vector<int32_t> dev_type, dev_machine;
  std::vector<int32_t> dev_host;                         // shared host executor of a device, or -1
  std::vector<int32_t> machine_kind;                     // per machine: machines of one kind are interchangeable
  int32_t num_hosts = 0;
  std::vector<int64_t> dev_capacity;
  std::vector<double> type_mem_bw, type_launch;          // per device type: memcpy-like op costs
  std::vector<int32_t> link_res_ptr, link_res;           // CSR over D*D ordered pairs (ids from 0)
  std::vector<double> link_bw, link_lat;                 // [D*D] bytes/s, seconds
  int32_t num_links = 0;
  Piecewise p2p_intra, p2p_inter;                        // fitted transfer models (optional)
  double host_message_s = 0;                             // CPU part of a gRPC transfer's latency
  std::vector<double> host_message;                      // per host: CPU a message takes from it (or empty)
  std::vector<double> host_copy;                         // per host: CPU seconds per byte of an all-reduce (or empty)
  std::vector<double> host_collective;                   // per host: seconds an all-reduce step waits for it (or empty)
  double fabric_bw = 1e30;                               // what the network carries at once, bytes/s
  bool hierarchical = false;                             // GPU all-reduces may run in two levels
  bool feed_local = false;                               // sources read on every replica (their own part)
  std::vector<Piecewise> allreduce_intra, allreduce_inter;  // fitted all-reduce, by device count
};

// Per-strategy input (borrowed).
struct StrategyView {
  const int32_t* grp_ptr = nullptr;     // [num_groups + 1] CSR into grp_devs
  const int32_t* grp_devs = nullptr;
  const uint8_t* grp_option = nullptr;  // [num_groups]
  const double* shares = nullptr;       // [num_devices] or nullptr (even)
  const int32_t* mp_part = nullptr;     // [num_ops] part of each op of a model-parallel group, else -1
  const uint8_t* op_dup = nullptr;      // [num_ops] 1: duplicated on its replicated group's devices (SFB)
  int32_t microbatches = 1;             // pipelined: each group's batch part in this many micro-batches
  int64_t fusion_bytes = 0;             // bucket cap for fused all-reduces; 0 = one tensor each
  bool sync_after_backward = false;     // all-reduces of a sync level wait for all its gradients
};

// What each task is, for traces and runtime-feedback features.
struct TaskMeta {
  std::vector<uint8_t> kind;
  std::vector<int32_t> op;        // planned op (compute) or producing op (conversions)
  std::vector<int32_t> device;    // device the task runs on (-1 for collectives)
  std::vector<int32_t> src;       // transfers: the task whose output is sent
  void clear() { kind.clear(); op.clear(); device.clear(); src.clear(); }
};

struct Layout {
  uint8_t mode = kSingle;
  uint8_t option = kAllReduce;
  std::vector<int32_t> devs;
  std::vector<int32_t> counts;    // replicated: samples per replica
  int32_t shard = -1;             // the first interned layout with these devices and counts (any option)
  int32_t micro = 1;              // micro-batches: each device listed this many times
  std::vector<int32_t> uniq;      // the devices, each once, in the order of their first replica
  // Set once the device classes are known (Expander::finish_layouts): the positions whose device
  // is simulated (its class's representative), each position's instance slot (-1: not simulated),
  // and, for layouts of several devices, the position of every device (-1: not a member).
  std::vector<int32_t> emit, slot, pos;
  int32_t size() const { return static_cast<int32_t>(devs.size()); }
  int32_t index_of(int32_t d) const {
    if (devs.size() == 1) return devs[0] == d ? 0 : -1;
    return pos[d];
  }
};

// Two replicated layouts, one micro-batched, whose replicas hold the same rows (devices may differ).
inline bool lines_up(const Layout& a, const Layout& b) {
  return a.mode == kReplicated && b.mode == kReplicated && std::max(a.micro, b.micro) > 1 && a.devs.size() == b.devs.size() &&
         a.counts == b.counts;
}

// Largest-remainder split of `total` by `weights`, every part at least 1: identical to
// tag_tf.strategy.split_counts (including its stable tie-breaking).
inline bool split_counts(int32_t total, const std::vector<double>& weights, std::vector<int32_t>& out) {
  const int32_t n = static_cast<int32_t>(weights.size());
  out.assign(n, 1);
  if (total < n) return false;
  double sum = 0;
  for (double w : weights) sum += w;
  const int32_t spare = total - n;
  std::vector<double> raw(n), frac(n);
  int32_t given = 0;
  for (int32_t i = 0; i < n; ++i) {
    raw[i] = weights[i] / sum * spare;
    const int32_t f = static_cast<int32_t>(std::floor(raw[i]));
    out[i] += f;
    given += f;
    frac[i] = raw[i] - f;
  }
  std::vector<int32_t> order(n);
  for (int32_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return -frac[a] < -frac[b]; });
  for (int32_t k = 0; k < spare - given; ++k) out[order[k]] += 1;
  return true;
}

class Expander {
 public:
  explicit Expander(const Prepared& p) : p_(p) {}

  // Fills `g` (and `meta` when given). Returns "" or one line naming the bad group/device.
  std::string expand(const StrategyView& s, TaskGraph& g, TaskMeta* meta, bool collapse = false) {
    g_ = &g;
    meta_ = meta;
    reset();
    if (auto err = build_layouts(s); !err.empty()) return err;
    // As the compiler decides (compiler/builder.py `pipelined`): any layout runs micro-batches.
    pipelined_ = std::any_of(layouts_.begin(), layouts_.end(), [](const Layout& l) { return l.micro > 1; });
    find_classes(collapse && s.microbatches == 1);
    finish_layouts();
    emit_compute();
    if (s.fusion_bytes > 0) plan_sums(s.fusion_bytes);
    emit_data_edges();
    emit_control_edges();
    emit_collectives(s.fusion_bytes, s.sync_after_backward);
    if (s.microbatches > 1) gate_microbatches();     // last: it checks every edge for a cycle
    finish();
    return "";
  }

  int32_t layout_of(int32_t op) const { return op_layout_[op]; }
  // The device whose results stand for d's in the last expansion (d itself when not collapsed),
  // and how many devices a simulated device stands for.
  int32_t rep_of(int32_t d) const { return dev_rep_[d]; }
  int32_t multiplicity(int32_t d) const { return dev_mult_[d]; }
  int32_t num_simulated() const { return num_simulated_; }
  // Whether the last collapsed expansion was exact: no simulated device standing for others sent
  // anything, and whatever a class received reached every member at once (no link carried two of
  // its pieces): its members then only compute alike and meet in collectives. Otherwise a class's
  // transfers go out or arrive as one block, where the members' would have come one by one.
  bool exact() const { return exact_; }
  bool link_simulated(int32_t k) const { return res_live_.empty() || res_live_[k]; }
  const Layout& layout(int32_t id) const { return layouts_[id]; }
  int32_t first_task(int32_t op) const { return inst_[op]; }
  // Conversions inserted by the last expansion (to compare with the compiler's counts).
  int32_t num_splits = 0, num_concats = 0, num_addns = 0, num_allreduces = 0, num_transfers = 0, num_zeros = 0,
          num_allreduce_tensors = 0, num_addn_tensors = 0, num_accumulates = 0;

 private:
  const Prepared& p_;
  TaskGraph* g_ = nullptr;
  TaskMeta* meta_ = nullptr;
  std::vector<Layout> layouts_;
  std::vector<int32_t> group_layout_, group_micro_, op_layout_, inst_, task_device_;
  std::unordered_map<int64_t, int32_t> memo_device_sum_;     // (tensor, device) -> micro-batches' sum there
  std::unordered_map<int64_t, std::vector<int32_t>> memo_msplit_;   // split_by_microbatch, as memo_split_
  std::unordered_map<int64_t, int32_t> memo_zeros_;           // (tensor, device) -> zeros there (micro-batches share)
  std::vector<int32_t> edge_from_, edge_to_;
  std::vector<uint8_t> edge_data_;
  std::unordered_map<int64_t, int32_t> memo_transfer_, memo_concat_, memo_addn_, memo_allreduce_;
  // All-reduce requests (by edge of their tensor) and the edges waiting for their results.
  std::vector<int32_t> request_edge_;
  struct PendingEdge { int32_t request, to; bool data; };
  std::vector<PendingEdge> pending_;
  std::unordered_map<int64_t, std::vector<int32_t>> memo_split_;
  std::unordered_map<int64_t, int32_t> memo_sum_transfer_;   // (tensor, sum device, to) -> transfer
  std::unordered_map<int64_t, int32_t> memo_relay_;          // (tensor, machine) -> its first copy there
  std::unordered_map<int64_t, int32_t> memo_relay_sum_;      // (tensor, sum device, machine) -> the same
  bool pipelined_ = false;
  std::vector<int32_t> last_collective_;
  // Device classes of the last expansion (see the header comment).
  std::vector<int32_t> dev_rep_, dev_mult_, class_ptr_, class_devs_;
  std::vector<uint8_t> res_live_;                             // empty: every link simulated
  std::unordered_map<int64_t, std::vector<int32_t>> weight_memo_;
  int32_t num_simulated_ = 0;
  bool exact_ = true;

  // ---------------------------------------------------------------------------------------
  void reset() {
    TaskGraph& g = *g_;
    g.duration.clear();
    g.res_ptr.assign(1, 0);
    g.res.clear();
    g.mem_device.clear();
    g.mem_bytes.clear();
    g.num_resources = 2 * p_.num_devices + p_.num_links + p_.num_hosts;
    g.persistent_bytes.assign(p_.num_devices, 0);
    g.capacity_bytes.assign(p_.dev_capacity.begin(), p_.dev_capacity.end());
    if (meta_) meta_->clear();
    layouts_.clear();
    task_device_.clear();
    edge_from_.clear();
    edge_to_.clear();
    edge_data_.clear();
    memo_transfer_.clear();
    memo_concat_.clear();
    memo_addn_.clear();
    memo_allreduce_.clear();
    memo_split_.clear();
    memo_sum_transfer_.clear();
    memo_relay_.clear();
    memo_relay_sum_.clear();
    memo_device_sum_.clear();
    memo_msplit_.clear();
    memo_zeros_.clear();
    request_edge_.clear();
    pending_.clear();
    last_collective_.assign(p_.num_devices, -1);
    num_splits = num_concats = num_addns = num_allreduces = num_transfers = num_zeros = num_allreduce_tensors =
        num_addn_tensors = num_accumulates = 0;
    for (int32_t d = 0; d < p_.num_devices; ++d) {  // single(d) layouts come first: id = d
      Layout l;
      l.devs = {d};
      layouts_.push_back(std::move(l));
    }
  }

  std::string build_layouts(const StrategyView& s) {
    const int32_t D = p_.num_devices;
    group_layout_.assign(p_.num_groups, -1);
    std::vector<uint8_t> seen(D, 0);
    for (int32_t gid = 0; gid < p_.num_groups; ++gid) {
      const int32_t lo = s.grp_ptr[gid], hi = s.grp_ptr[gid + 1];
      if (hi <= lo) return "group " + std::to_string(gid) + ": no devices";
      std::fill(seen.begin(), seen.end(), 0);
      Layout l;
      for (int32_t k = lo; k < hi; ++k) {
        const int32_t d = s.grp_devs[k];
        if (d < 0 || d >= D) return "group " + std::to_string(gid) + ": device " + std::to_string(d) + " does not exist";
        if (seen[d]) return "group " + std::to_string(gid) + ": device " + std::to_string(d) + " appears twice";
        seen[d] = 1;
        l.devs.push_back(d);
      }
      const uint8_t opt = s.grp_option[gid];
      if (opt > kModelParallel) return "group " + std::to_string(gid) + ": unknown option";
      if (l.size() == 1 || opt == kModelParallel) {
        group_layout_[gid] = l.devs[0];
        continue;
      }
      l.option = opt;
      if (opt == kDuplicate) {
        l.mode = kDuplicated;
      } else {
        l.mode = kReplicated;
        std::vector<double> w(l.size(), 1.0);
        if (s.shares)
          for (int32_t k = 0; k < l.size(); ++k) w[k] = s.shares[l.devs[k]];
        if (!split_counts(p_.batch, w, l.counts))
          return "group " + std::to_string(gid) + ": batch size " + std::to_string(p_.batch) +
                 " is smaller than its " + std::to_string(l.size()) + " replicas";
      }
      group_layout_[gid] = intern(std::move(l));
    }
    // Pipelined: each group's micro-batched layout (its base where that keeps whole batches).
    const int32_t M = s.microbatches;
    group_micro_.assign(p_.num_groups, -1);
    for (int32_t gid = 0; gid < p_.num_groups && M > 1; ++gid) {
      int32_t id = micro_layout(group_layout_[gid], M);
      if (id == -2) return "group " + std::to_string(gid) + ": batch size " + std::to_string(p_.batch) +
                           " is too small for " + std::to_string(M) + " micro-batches";
      group_micro_[gid] = id;
    }
    // Op layouts: sources are fed once, MP ops go to their part, PS variables to their server.
    op_layout_.assign(p_.num_ops, -1);
    std::unordered_map<int64_t, int32_t> ps_of;   // (group, colocation set) -> device
    std::vector<int32_t> next_ps(p_.num_groups, 0);
    for (int32_t op = 0; op < p_.num_ops; ++op) {
      const int32_t gid = p_.op_group[op];
      const int32_t base = group_layout_[gid];
      const Layout& bl = layouts_[base];
      const int32_t lo = s.grp_ptr[gid], n = s.grp_ptr[gid + 1] - lo;
      const uint8_t opt = s.grp_option[gid];
      if (p_.op_flags[op] & kSource) {
        // Fed once, on the group's first device; or, where every machine reads its own part of
        // each batch, on every replica of a replicated group.
        op_layout_[op] = p_.feed_local && bl.mode == kReplicated ? base : s.grp_devs[lo];
      } else if (opt == kModelParallel && n > 1) {
        const int32_t part = s.mp_part ? s.mp_part[op] : 0;
        if (part < 0) return "op " + std::to_string(op) + ": model-parallel group " + std::to_string(gid) + " without a part";
        const int32_t d = s.grp_devs[lo + part % n];
        op_layout_[op] = M > 1 && !(p_.op_flags[op] & kKeepsState) ? micro_layout(d, M) : d;
      } else if (opt == kPS && bl.mode == kReplicated && (p_.op_flags[op] & kVariableSide)) {
        const int64_t key = static_cast<int64_t>(gid) * p_.num_ops + p_.op_coloc[op];
        auto it = ps_of.find(key);
        if (it == ps_of.end()) it = ps_of.emplace(key, bl.devs[next_ps[gid]++ % bl.size()]).first;
        op_layout_[op] = it->second;
      } else if (s.op_dup && s.op_dup[op] && bl.mode == kReplicated) {
        // Sufficient factor broadcasting: the whole batch on every device of the group, so the
        // gradient it produces is complete everywhere (tag_tf/placement/layout.py, same rule).
        Layout l;
        l.mode = kDuplicated;
        l.option = bl.option;
        l.devs = bl.devs;
        op_layout_[op] = intern(std::move(l));
      } else {
        op_layout_[op] = M > 1 && !(p_.op_flags[op] & kKeepsState) ? group_micro_[gid] : base;
      }
    }
    return "";
  }

  // Layout `base` run as `micro` micro-batches (tag_tf/placement/layout.py's _micro_layout): each
  // micro-batch split over base's devices as base splits the batch. -2: the batch is too small.
  int32_t micro_layout(int32_t base, int32_t micro) {
    const Layout& b = layouts_[base];
    if (micro == 1 || b.mode == kDuplicated) return base;
    const int32_t k = b.size();
    std::vector<double> parts(micro, 1.0), share(k, 1.0);
    if (b.mode == kReplicated)
      for (int32_t i = 0; i < k; ++i) share[i] = b.counts[i];
    std::vector<int32_t> sizes, piece;
    Layout l;
    l.mode = kReplicated;
    l.option = b.option;
    l.micro = micro;
    if (!split_counts(p_.batch, parts, sizes)) return -2;
    for (int32_t m = 0; m < micro; ++m) {
      if (!split_counts(sizes[m], share, piece)) return -2;
      for (int32_t i = 0; i < k; ++i) {
        l.devs.push_back(b.devs[i]);
        l.counts.push_back(piece[i]);
      }
    }
    return intern(std::move(l));
  }

  int32_t intern(Layout l) {
    for (size_t i = p_.num_devices; i < layouts_.size(); ++i) {
      const Layout& o = layouts_[i];
      if (o.mode == l.mode && o.devs == l.devs && o.counts == l.counts) {   // (devs say the micro-batches)
        if (o.option == l.option) return static_cast<int32_t>(i);
        if (l.shard < 0) l.shard = o.shard;
      }
    }
    const int32_t id = static_cast<int32_t>(layouts_.size());
    if (l.shard < 0) l.shard = id;
    layouts_.push_back(std::move(l));
    return id;
  }

  // The state edge e's tensor has, produced under layout P: whole on a single device, as the
  // analysis says on replicas; an input read on every replica holds that replica's part.
  uint8_t state_of(int32_t e, const Layout& P) const {
    if (P.mode != kReplicated) return kFull;
    if (p_.feed_local && (p_.op_flags[p_.e_src[e]] & kSource) && p_.e_state[e] == kFull) return kSplit;
    return p_.e_state[e];
  }

  static bool same_split(const Layout& a, const Layout& b) {
    return a.mode == kReplicated && b.mode == kReplicated && a.devs == b.devs && a.counts == b.counts;
  }

  static uint64_t mix(uint64_t h, uint64_t v) {   // splitmix64 over (h, v)
    uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // Device classes (header comment): dev_rep_, dev_mult_, the members of each class and the links
  // a simulated task can hold.
  void find_classes(bool collapse) {
    const int32_t D = p_.num_devices, M = static_cast<int32_t>(p_.machine_kind.size());
    dev_rep_.resize(D);
    dev_mult_.assign(D, 1);
    res_live_.clear();
    weight_memo_.clear();
    exact_ = true;
    if (!collapse || M == 0) {
      for (int32_t d = 0; d < D; ++d) dev_rep_[d] = d;
      class_ptr_.resize(D + 1);
      class_devs_.resize(D);
      for (int32_t d = 0; d <= D; ++d) class_ptr_[d] = d;
      for (int32_t d = 0; d < D; ++d) class_devs_[d] = d;
      num_simulated_ = D;
      return;
    }
    std::vector<uint8_t> special(D, 0);
    for (int32_t op = 0; op < p_.num_ops; ++op)
      if (op_layout_[op] < D) special[op_layout_[op]] = 1;
    for (size_t i = D; i < layouts_.size(); ++i) special[layouts_[i].devs[0]] = 1;
    std::vector<uint64_t> sig(D);
    for (int32_t d = 0; d < D; ++d) {
      if (p_.dev_host[d] >= 0) special[d] = 1;
      sig[d] = special[d] ? mix(0x5bd1e995ULL, static_cast<uint64_t>(d)) : mix(1, static_cast<uint64_t>(p_.dev_type[d]));
    }
    for (size_t i = D; i < layouts_.size(); ++i) {
      const Layout& l = layouts_[i];
      for (int32_t j = 0; j < l.size(); ++j) {
        const int32_t d = l.devs[j];
        if (!special[d]) sig[d] = mix(mix(sig[d], i), l.mode == kReplicated ? static_cast<uint64_t>(l.counts[j]) : ~0ULL);
      }
    }
    std::vector<std::vector<uint64_t>> held(M);
    for (int32_t d = 0; d < D; ++d) held[p_.dev_machine[d]].push_back(sig[d]);
    std::vector<uint64_t> msig(M);
    for (int32_t m = 0; m < M; ++m) {
      std::sort(held[m].begin(), held[m].end());
      uint64_t h = mix(2, static_cast<uint64_t>(p_.machine_kind[m]));
      for (uint64_t v : held[m]) h = mix(h, v);
      msig[m] = h;
    }
    std::unordered_map<uint64_t, int32_t> rep;
    for (int32_t d = 0; d < D; ++d) {
      const uint64_t key = mix(sig[d], msig[p_.dev_machine[d]]);
      auto it = rep.emplace(key, d).first;
      dev_rep_[d] = it->second;
      if (it->second != d) ++dev_mult_[it->second];
    }
    for (int32_t d = 0; d < D; ++d)
      if (dev_rep_[d] != d) dev_mult_[d] = dev_mult_[dev_rep_[d]];
    // Members by class (CSR indexed by representative).
    class_ptr_.assign(D + 1, 0);
    for (int32_t d = 0; d < D; ++d) ++class_ptr_[dev_rep_[d] + 1];
    for (int32_t d = 0; d < D; ++d) class_ptr_[d + 1] += class_ptr_[d];
    class_devs_.resize(D);
    std::vector<int32_t> fill(class_ptr_.begin(), class_ptr_.end() - 1);
    for (int32_t d = 0; d < D; ++d) class_devs_[fill[dev_rep_[d]]++] = d;
    std::vector<int32_t> sim;
    for (int32_t d = 0; d < D; ++d)
      if (dev_rep_[d] == d) sim.push_back(d);
    num_simulated_ = static_cast<int32_t>(sim.size());
    res_live_.assign(p_.num_links, 0);
    for (int32_t a : sim)
      for (int32_t b : sim) {
        if (a == b) continue;
        const size_t pair = static_cast<size_t>(a) * D + b;
        for (int32_t k = p_.link_res_ptr[pair]; k < p_.link_res_ptr[pair + 1]; ++k) res_live_[p_.link_res[k]] = 1;
      }
  }

  // Each layout's simulated positions, instance slots and device positions.
  void finish_layouts() {
    const int32_t D = p_.num_devices;
    for (size_t i = 0; i < layouts_.size(); ++i) {
      Layout& l = layouts_[i];
      l.emit.clear();
      l.slot.assign(l.size(), -1);
      for (int32_t j = 0; j < l.size(); ++j)
        if (dev_rep_[l.devs[j]] == l.devs[j]) {
          l.slot[j] = static_cast<int32_t>(l.emit.size());
          l.emit.push_back(j);
        }
      if (l.size() > 1) {
        l.pos.assign(D, -1);
        for (int32_t j = 0; j < l.size(); ++j)
          if (l.pos[l.devs[j]] < 0) l.pos[l.devs[j]] = j;      // a device's first replica
      }
      l.uniq.clear();
      for (int32_t j = 0; j < l.size(); ++j)
        if (l.micro == 1 || std::find(l.uniq.begin(), l.uniq.end(), l.devs[j]) == l.uniq.end()) l.uniq.push_back(l.devs[j]);
    }
  }

  // How many transfers of one piece a transfer from -> to stands for on each of its links (in the
  // order of the pair's link list): the member pairs of the two classes that hold that link. Empty
  // when both are alone in their class (one transfer).
  const std::vector<int32_t>& link_counts(int32_t from, int32_t to) {
    static const std::vector<int32_t> none;
    if (dev_mult_[from] == 1 && dev_mult_[to] == 1) return none;
    const int32_t D = p_.num_devices;
    const int64_t key = static_cast<int64_t>(from) * D + to;
    auto it = weight_memo_.find(key);
    if (it != weight_memo_.end()) return it->second;
    const size_t pair = static_cast<size_t>(from) * D + to;
    std::vector<int32_t> counts;
    for (int32_t k = p_.link_res_ptr[pair]; k < p_.link_res_ptr[pair + 1]; ++k) {
      const int32_t r = p_.link_res[k];
      int32_t count = 0;
      for (int32_t i = class_ptr_[from]; i < class_ptr_[from + 1]; ++i)
        for (int32_t j = class_ptr_[to]; j < class_ptr_[to + 1]; ++j) {
          const int32_t a = class_devs_[i], b = class_devs_[j];
          if (a == b) continue;
          const size_t ab = static_cast<size_t>(a) * D + b;
          for (int32_t q = p_.link_res_ptr[ab]; q < p_.link_res_ptr[ab + 1]; ++q) count += p_.link_res[q] == r;
        }
      counts.push_back(std::max(count, 1));
    }
    return weight_memo_.emplace(key, std::move(counts)).first->second;
  }

  // ---------------------------------------------------------------------------------------
  int32_t add_task(uint8_t kind, double duration, int32_t device, int32_t op, int64_t bytes,
                   std::initializer_list<int32_t> resources, int32_t src = -1) {
    TaskGraph& g = *g_;
    const int32_t id = static_cast<int32_t>(g.duration.size());
    g.duration.push_back(duration);
    for (int32_t r : resources) g.res.push_back(r);
    g.res_ptr.push_back(static_cast<int32_t>(g.res.size()));
    g.mem_device.push_back(bytes > 0 ? device : -1);
    g.mem_bytes.push_back(bytes > 0 ? bytes : 0);
    task_device_.push_back(device);
    if (meta_) {
      meta_->kind.push_back(kind);
      meta_->op.push_back(op);
      meta_->device.push_back(device);
      meta_->src.push_back(src);
    }
    return id;
  }

  // Task ids <= -2 stand for all-reduce request -2 - id, resolved by emit_collectives.
  static int32_t placeholder(int32_t request) { return -2 - request; }

  void edge(int32_t from, int32_t to, bool data) {
    if (from <= -2) {
      pending_.push_back({-2 - from, to, data});
      return;
    }
    if (from < 0) return;   // a free (LOCAL) value: no dependency
    edge_from_.push_back(from);
    edge_to_.push_back(to);
    edge_data_.push_back(data ? 1 : 0);
  }

  double memcpy_time(int32_t device, double bytes) const {
    const int32_t t = p_.dev_type[device];
    return p_.type_launch[t] + bytes / p_.type_mem_bw[t];
  }

  double p2p_time(int32_t a, int32_t b, double bytes) const {
    const bool same_machine = p_.dev_machine[a] == p_.dev_machine[b];
    const Piecewise& fit = same_machine ? p_.p2p_intra : p_.p2p_inter;
    if (!fit.empty()) return fit(bytes);
    const size_t k = static_cast<size_t>(a) * p_.num_devices + b;
    return p_.link_lat[k] + bytes / p_.link_bw[k];
  }

  double allreduce_time(const std::vector<int32_t>& devs, double bytes) const {
    const size_t n = devs.size();
    bool one_machine = true;
    for (int32_t d : devs) one_machine &= p_.dev_machine[d] == p_.dev_machine[devs[0]];
    const std::vector<Piecewise>& fits = one_machine ? p_.allreduce_intra : p_.allreduce_inter;
    if (n < fits.size() && !fits[n].empty()) return fits[n](bytes);
    // Ring in machine-major order: 2(n-1)/n of the data over the slowest hop, 2(n-1) latencies.
    std::vector<int32_t> ring(devs);
    std::sort(ring.begin(), ring.end(), [&](int32_t a, int32_t b) {
      return p_.dev_machine[a] != p_.dev_machine[b] ? p_.dev_machine[a] < p_.dev_machine[b] : a < b;
    });
    double bw = INFINITY, lat = 0;
    int32_t hops = 0;                 // hops between machines: every one moves at once in each step
    for (size_t k = 0; k < n; ++k) {
      const size_t pair = static_cast<size_t>(ring[k]) * p_.num_devices + ring[(k + 1) % n];
      bw = std::min(bw, p_.link_bw[pair]);
      lat = std::max(lat, p_.link_lat[pair]);
      hops += p_.dev_machine[ring[k]] != p_.dev_machine[ring[(k + 1) % n]];
    }
    if (hops > 0) bw = std::min(bw, p_.fabric_bw / hops);   // a blocking network shares what it carries
    // Between two CPU processes each member's CPU also copies, serialises and sums the data
    // (Machine.copy_bandwidth) after the link: the slower member sets it. Measured: two emulated
    // hosts all-reduced 51 MB in 580 ms on full cores, 710 ms on half cores, the link alone 440 ms.
    // Rings of three or more processes measured no such addition (the wide cnn's data-parallel step
    // on the emulated compute cluster: 2182 ms, 2470 predicted without it, 3196 with it): there the
    // ring's steps overlap one chunk's copies with another's transfer.
    double copy = 0;
    if (hops > 0 && n == 2)
      for (int32_t d : ring) copy = std::max(copy, host_copy(p_.dev_host[d]));
    // Every step is a message each member takes, sums and passes on: it waits for the slowest
    // member, whose CPU quota may run out within the step while it computes (Machine.collective_step_s).
    if (hops > 0)
      for (int32_t d : ring) lat = std::max(lat, host_collective(p_.dev_host[d]));
    const double flat = 2.0 * (n - 1) / n * bytes * (1.0 / bw + copy) + 2.0 * (n - 1) * lat;
    if (!p_.hierarchical || hops < 2 || hops == static_cast<int32_t>(n)) return flat;
    return std::min(flat, two_level_time(ring, bytes));
  }

  // NCCL's and Horovod's two-level all-reduce over `ring` (machine-major, GPUs only): a
  // reduce-scatter inside every machine, an all-reduce over the machines (each machine's GPUs take
  // a slice each, together the whole tensor through the machine's port), an all-gather inside every
  // machine. The slowest machine sets each inner phase.
  double two_level_time(const std::vector<int32_t>& ring, double bytes) const {
    const size_t n = ring.size();
    double inner = 0, bw = INFINITY, lat = 0;
    int32_t machines = 0;
    for (size_t lo = 0; lo < n;) {
      size_t hi = lo;
      while (hi < n && p_.dev_machine[ring[hi]] == p_.dev_machine[ring[lo]]) ++hi;
      const size_t g = hi - lo;
      if (p_.dev_host[ring[lo]] >= 0) return INFINITY;          // CPU tasks: TensorFlow's flat ring
      if (g > 1) {
        const size_t pair = static_cast<size_t>(ring[lo]) * p_.num_devices + ring[lo + 1];
        inner = std::max(inner, (g - 1.0) / g * bytes / p_.link_bw[pair] + (g - 1.0) * p_.link_lat[pair]);
      }
      const size_t next = hi % n;                                  // to the next machine's first GPU
      const size_t pair = static_cast<size_t>(ring[lo]) * p_.num_devices + ring[next];
      bw = std::min(bw, p_.link_bw[pair]);
      lat = std::max(lat, p_.link_lat[pair]);
      ++machines;
      lo = hi;
    }
    bw = std::min(bw, p_.fabric_bw / machines);
    // Between the machines NCCL's double binary trees: the ring's bandwidth, latency in log2(m) hops.
    const double m = machines;
    return 2.0 * inner + 2.0 * (m - 1) / m * bytes / bw + 2.0 * std::ceil(std::log2(m)) * lat;
  }

  // ---------------------------------------------------------------------------------------
  void emit_compute() {
    inst_.assign(p_.num_ops, -1);
    const double B = p_.batch;
    for (int32_t op = 0; op < p_.num_ops; ++op) {
      const Layout& l = layouts_[op_layout_[op]];
      inst_[op] = static_cast<int32_t>(g_->duration.size());
      if (p_.op_persist[op] > 0)
        for (int32_t d : l.uniq) g_->persistent_bytes[d] += p_.op_persist[op];
      for (int32_t j : l.emit) {
        const int32_t d = l.devs[j];
        const double samples = l.mode == kReplicated ? l.counts[j] : B;
        const size_t k = static_cast<size_t>(p_.dev_type[d]) * p_.num_ops + op;
        const double t = p_.op_fixed[k] + p_.op_per_sample[k] * samples;
        const int64_t bytes = p_.op_out_fixed[op] + static_cast<int64_t>(p_.op_out_batched[op] * (samples / B));
        if (p_.dev_host[d] >= 0)
          add_task(kCompute, t, d, op, bytes, {d, host_resource(p_.dev_host[d])});
        else
          add_task(kCompute, t, d, op, bytes, {d});
      }
    }
  }

  // The task of op's instance at position j of its layout (j's device must be simulated).
  int32_t instance(int32_t op, int32_t j) const { return inst_[op] + layouts_[op_layout_[op]].slot[j]; }
  int32_t host_resource(int32_t host) const { return 2 * p_.num_devices + p_.num_links + host; }
  double host_copy(int32_t host) const {
    return host >= 0 && static_cast<size_t>(host) < p_.host_copy.size() ? p_.host_copy[host] : 0.0;
  }
  double host_collective(int32_t host) const {
    return host >= 0 && static_cast<size_t>(host) < p_.host_collective.size() ? p_.host_collective[host] : 0.0;
  }
  double host_message(int32_t host) const {
    return host >= 0 && static_cast<size_t>(host) < p_.host_message.size() ? p_.host_message[host] : 0.0;
  }

  int32_t transfer(int32_t task, int32_t to, int64_t bytes, bool memo = true) {
    const int32_t from = task_device_[task];
    if (from == to || from < 0) return task;
    const int64_t key = static_cast<int64_t>(task) * p_.num_devices + to;
    if (memo) {
      auto it = memo_transfer_.find(key);
      if (it != memo_transfer_.end()) return it->second;
    }
    const size_t pair = static_cast<size_t>(from) * p_.num_devices + to;
    TaskGraph& g = *g_;
    // A collapsed transfer (header comment) holds its busiest links for all the pieces they carry;
    // links that carry fewer are held that much shorter by a task beside it.
    const std::vector<int32_t>& counts = link_counts(from, to);
    const int32_t most = counts.empty() ? 1 : *std::max_element(counts.begin(), counts.end());
    // Exact only while members receive together: a class that sends, or pieces that queue for one
    // link (its members would receive one after another, and start their next ops apart), is not.
    exact_ = exact_ && dev_mult_[from] == 1 && most == 1;
    const double piece = p2p_time(from, to, static_cast<double>(bytes));
    const double total = most * piece;
    // Between CPU devices of two processes a transfer is a gRPC request: host_message_s of its
    // latency is CPU work (request handling in both processes) that holds both executors; the rest
    // of the latency is waiting. The bytes then move on the link beside the ops: on this
    // machine's two cores, charging them to the executors as well predicted worse
    // (benchmarks/simulator_accuracy.py).
    // (Processes are machines; one executor may serve several of them: then it is held once.)
    const int32_t ha = p_.dev_host[from], hb = p_.dev_host[to];
    double duration = total;
    double piece_latency = 0.0;       // of each piece: waited before the bytes move (not on links)
    int32_t handled = -1;
    if (ha >= 0 && hb >= 0 && p_.dev_machine[from] != p_.dev_machine[to]) {
      const double latency = std::min(p2p_time(from, to, 0.0), total);
      const double cpu = std::min(p_.host_message_s, latency);
      // Each side's own part, measured per machine while it computes (Machine.message_s): the sender
      // answers the request, the receiver takes the reply; the same CPU on a quarter of a core is
      // several times a full core's. What the latency (measured idle) already holds is not waited again.
      const double sent = host_message(ha), got = ha != hb ? host_message(hb) : 0.0;
      const int32_t op = meta_ ? meta_->op[task] : -1;
      const int32_t wait = add_task(kTransfer, std::max(latency - cpu - sent - got, 0.0), to, op, 0, {}, task);
      handled = hb != ha ? add_task(kTransfer, cpu, to, op, 0, {host_resource(ha), host_resource(hb)}, task)
                         : add_task(kTransfer, cpu, to, op, 0, {host_resource(ha)}, task);
      edge(task, wait, false);
      edge(wait, handled, false);
      for (const auto& [host, seconds] : {std::pair{ha, sent}, std::pair{hb, got}}) {
        if (seconds <= 0) continue;
        const int32_t part = add_task(kTransfer, seconds, to, op, 0, {host_resource(host)}, task);
        edge(handled, part, false);
        handled = part;
      }
      duration = total - latency;
    } else if (p_.dev_machine[from] != p_.dev_machine[to]) {
      // Between machines the latency is a wait (propagation, the request's round trip) that holds
      // no link: messages in flight overlap their latencies and queue only for the bytes. Held on
      // the link, thousands of small reads a pipelined plan sends (optimizer scalars, one per
      // update op) queued 25 us each behind one another on a port that moved no bytes.
      const double latency = std::min(p2p_time(from, to, 0.0), piece);
      if (latency > 0) {
        handled = add_task(kTransfer, latency, to, meta_ ? meta_->op[task] : -1, 0, {}, task);
        edge(task, handled, false);
        duration = most * (piece - latency);
        piece_latency = latency;
      }
    }
    const int32_t lo = p_.link_res_ptr[pair], hi = p_.link_res_ptr[pair + 1];
    for (int32_t k = lo; k < hi; ++k) {
      const int32_t c = counts.empty() ? most : counts[k - lo];
      if (c == most) continue;
      bool first = true;                 // one task per smaller count, holding its links
      for (int32_t q = lo; q < k; ++q) first &= counts[q - lo] != c;
      if (!first) continue;
      const int32_t side = static_cast<int32_t>(g.duration.size());
      g.duration.push_back(c * (piece - piece_latency));
      for (int32_t q = k; q < hi; ++q)
        if (counts[q - lo] == c) g.res.push_back(2 * p_.num_devices + p_.link_res[q]);
      g.res_ptr.push_back(static_cast<int32_t>(g.res.size()));
      g.mem_device.push_back(-1);
      g.mem_bytes.push_back(0);
      task_device_.push_back(to);
      if (meta_) {
        meta_->kind.push_back(kTransfer);
        meta_->op.push_back(meta_->op[task]);
        meta_->device.push_back(to);
        meta_->src.push_back(-1);
      }
      edge(piece_latency > 0 ? handled : task, side, false);   // the bytes move once the latency is waited
    }
    const int32_t id = static_cast<int32_t>(g.duration.size());
    g.duration.push_back(duration);
    for (int32_t k = lo; k < hi; ++k)
      if (counts.empty() || counts[k - lo] == most) g.res.push_back(2 * p_.num_devices + p_.link_res[k]);
    g.res_ptr.push_back(static_cast<int32_t>(g.res.size()));
    // Each member of to's class receives one piece from every member of from's class.
    const int64_t landed = std::max<int64_t>(bytes, 0) * (dev_rep_[from] == from ? dev_mult_[from] : 1);
    g.mem_device.push_back(landed > 0 ? to : -1);
    g.mem_bytes.push_back(landed);
    task_device_.push_back(to);
    if (meta_) {
      meta_->kind.push_back(kTransfer);
      meta_->op.push_back(meta_->op[task]);
      meta_->device.push_back(to);
      meta_->src.push_back(task);
    }
    ++num_transfers;
    edge(task, id, true);                 // the bytes part reads the source buffer
    edge(handled, id, false);
    if (memo) memo_transfer_.emplace(key, id);
    return id;
  }

  // The whole value of edge e's tensor on device d (a task whose end makes it available there,
  // or -1 when it is free). `consumer` is the consuming layout or -1.
  int32_t full_on(int32_t e, int32_t d, int32_t consumer) {
    const int32_t src = p_.e_src[e];
    const Layout& P = layouts_[op_layout_[src]];
    const uint8_t st = state_of(e, P);
    const int64_t bytes = p_.e_bytes[e];
    const int64_t key = static_cast<int64_t>(p_.e_tensor[e]) * p_.num_devices + d;
    switch (st) {
      case kFull: {
        const int32_t k = P.index_of(d);
        if (k >= 0) return instance(src, k);
        if (!pipelined_ || p_.dev_machine[P.devs[0]] == p_.dev_machine[d]) return transfer(instance(src, 0), d, bytes);
        // Pipelined plans: a whole value crosses to another machine once; the machine's other
        // devices copy it from the first one there (compiler/builder.py full_on, `relay`).
        const int64_t rkey = static_cast<int64_t>(p_.e_tensor[e]) * p_.num_devices + p_.dev_machine[d];
        auto it = memo_relay_.find(rkey);
        if (it != memo_relay_.end()) return transfer(it->second, d, bytes);
        const int32_t got = transfer(instance(src, 0), d, bytes);
        memo_relay_.emplace(rkey, got);
        return got;
      }
      case kSplit: {
        auto it = memo_concat_.find(key);
        if (it != memo_concat_.end()) return it->second;
        std::vector<int32_t> pieces;
        for (int32_t k : P.emit) pieces.push_back(transfer(instance(src, k), d, bytes * P.counts[k] / p_.batch));
        const int32_t c = add_task(kConcat, memcpy_time(d, 2.0 * bytes), d, src, bytes, {d});
        for (int32_t piece : pieces) edge(piece, c, true);
        ++num_concats;
        memo_concat_.emplace(key, c);
        return c;
      }
      case kPartial: {
        if (consumer >= 0) {
          const Layout& C = layouts_[consumer];
          if (C.mode != kSingle && P.option == kAllReduce && same_set(C.uniq, P.uniq) && P.uniq.size() > 1)
            return all_reduce(e);
        }
        const int32_t agg = (consumer < 0 || layouts_[consumer].mode == kSingle) ? d : P.devs[0];
        const int64_t akey = static_cast<int64_t>(p_.e_tensor[e]) * p_.num_devices + agg;
        int32_t sum;
        auto it = memo_addn_.find(akey);
        if (it != memo_addn_.end()) {
          sum = it->second;
        } else if (P.micro > 1 && P.uniq.size() == 1 && P.uniq[0] == agg) {
          sum = device_sum(e, agg);          // a stage alone on agg: its micro-batches' sum is the sum
          memo_addn_.emplace(akey, sum);
        } else if (P.micro > 1) {
          // Each other machine's devices add theirs up there first: one sum leaves each machine
          // (compiler/collectives.py _add_n).
          std::vector<int32_t> parts;
          std::vector<std::pair<int32_t, std::vector<int32_t>>> machines;   // in order of first device
          for (int32_t u : P.uniq) {
            const int32_t m = p_.dev_machine[u] == p_.dev_machine[agg] ? -1 - u : p_.dev_machine[u];
            auto at = std::find_if(machines.begin(), machines.end(), [m](const auto& x) { return x.first == m; });
            if (at == machines.end()) machines.push_back({m, {u}});
            else at->second.push_back(u);
          }
          for (const auto& [m, devs] : machines) {
            if (devs.size() == 1) {
              parts.push_back(transfer(device_sum(e, devs[0]), agg, bytes));
              continue;
            }
            const int32_t first = devs[0];
            const int32_t pre = add_task(kAddN, memcpy_time(first, (devs.size() + 1.0) * bytes), first, src, bytes, {first});
            for (int32_t u : devs) edge(transfer(device_sum(e, u), first, bytes), pre, true);
            parts.push_back(transfer(pre, agg, bytes));
          }
          sum = add_task(kAddN, memcpy_time(agg, (parts.size() + 1.0) * bytes), agg, src, bytes, {agg});
          for (int32_t part : parts) edge(part, sum, true);
          ++num_addns;
          ++num_addn_tensors;
          memo_addn_.emplace(akey, sum);
        } else {
          std::vector<int32_t> parts;
          for (int32_t k : P.emit) parts.push_back(transfer(instance(src, k), agg, bytes));
          sum = add_task(kAddN, memcpy_time(agg, (P.size() + 1.0) * bytes), agg, src, bytes, {agg});
          for (int32_t part : parts) edge(part, sum, true);
          ++num_addns;
          ++num_addn_tensors;
          memo_addn_.emplace(akey, sum);
        }
        if (d == agg) return sum;
        // Per tensor: a fused bucket's unpack task holds several tensors, each sent on its own.
        const int64_t tkey = akey * p_.num_devices + d;
        auto tt = memo_sum_transfer_.find(tkey);
        if (tt != memo_sum_transfer_.end()) return tt->second;
        int32_t moved;
        if (pipelined_ && p_.dev_machine[agg] != p_.dev_machine[d]) {    // once per machine, as kFull
          const int64_t rkey = akey * p_.num_devices + p_.dev_machine[d];
          auto rt = memo_relay_sum_.find(rkey);
          moved = transfer(rt != memo_relay_sum_.end() ? rt->second : sum, d, bytes, /*memo=*/false);
          if (rt == memo_relay_sum_.end()) memo_relay_sum_.emplace(rkey, moved);
        } else {
          moved = transfer(sum, d, bytes, /*memo=*/false);
        }
        memo_sum_transfer_.emplace(tkey, moved);
        return moved;
      }
      default:
        return -1;   // LOCAL: recomputed where needed, modelled as free
    }
  }

  // Edge e's partial sums on device d added up: its one replica there, or (micro-batched) the sum
  // of its micro-batches there, accumulated where they were computed: as the compiler emits it
  // (compiler/collectives.py _accumulate), a chain of additions in micro-batch order, each reading
  // the running sum and one micro-batch's value and writing the sum.
  int32_t device_sum(int32_t e, int32_t d) {
    const int32_t src = p_.e_src[e];
    const Layout& P = layouts_[op_layout_[src]];
    if (P.micro == 1) return instance(src, P.index_of(d));
    const int64_t key = static_cast<int64_t>(p_.e_tensor[e]) * p_.num_devices + d;
    auto it = memo_device_sum_.find(key);
    if (it != memo_device_sum_.end()) return it->second;
    const int64_t bytes = p_.e_bytes[e];
    int32_t sum = -1;
    for (int32_t j = 0; j < P.size(); ++j) {
      if (P.devs[j] != d) continue;
      if (sum == -1) {
        sum = instance(src, j);
        continue;
      }
      const int32_t add = add_task(kAddN, memcpy_time(d, 3.0 * bytes), d, src, bytes, {d});
      edge(sum, add, true);
      edge(instance(src, j), add, true);
      sum = add;
    }
    ++num_accumulates;
    memo_device_sum_.emplace(key, sum);
    return sum;
  }

  // Between pipeline stages split over other devices (both micro-batched alike): each micro-batch's
  // pieces regrouped on their own (the compiler's _split_by_microbatch). Pieces by instance slot.
  const std::vector<int32_t>& split_by_microbatch(int32_t e, int32_t consumer) {
    const int64_t key = static_cast<int64_t>(p_.e_tensor[e]) * (1 << 20) + shard_layout(consumer);
    auto it = memo_msplit_.find(key);
    if (it != memo_msplit_.end()) return it->second;
    const int32_t src = p_.e_src[e];
    const Layout& P = layouts_[op_layout_[src]];
    const Layout& C = layouts_[consumer];
    const int32_t M = C.micro, kp = P.size() / M, kc = C.size() / M;
    const double per_sample = static_cast<double>(p_.e_bytes[e]) / p_.batch;
    std::vector<int32_t> pieces;
    for (int32_t m = 0; m < M; ++m) {
      bool same = kp == kc;
      int64_t rows = 0;
      for (int32_t i = 0; i < kc; ++i) rows += C.counts[m * kc + i];
      for (int32_t i = 0; same && i < kc; ++i) same = P.counts[m * kp + i] == C.counts[m * kc + i];
      if (same) {
        for (int32_t i = 0; i < kc; ++i)
          pieces.push_back(transfer(instance(src, m * kp + i), C.devs[m * kc + i],
                                    static_cast<int64_t>(per_sample * C.counts[m * kc + i])));
        continue;
      }
      const int32_t at = C.devs[m * kc];
      const int64_t block = static_cast<int64_t>(per_sample * rows);
      int32_t whole;
      if (kp == 1) {
        whole = transfer(instance(src, m * kp), at, block);
      } else {
        whole = add_task(kConcat, memcpy_time(at, 2.0 * block), at, src, block, {at});
        for (int32_t i = 0; i < kp; ++i)
          edge(transfer(instance(src, m * kp + i), at, static_cast<int64_t>(per_sample * P.counts[m * kp + i])), whole,
               true);
      }
      if (kc == 1) {
        pieces.push_back(whole);
        continue;
      }
      const int32_t sp = add_task(kSplitTask, memcpy_time(at, 2.0 * block), at, src, block, {at});
      edge(whole, sp, true);
      for (int32_t i = 0; i < kc; ++i)
        pieces.push_back(transfer(sp, C.devs[m * kc + i], static_cast<int64_t>(per_sample * C.counts[m * kc + i])));
    }
    ++num_splits;                  // one conversion per tensor and layout, as the compiler counts it
    return memo_msplit_.emplace(key, std::move(pieces)).first->second;
  }

  static bool same_set(std::vector<int32_t> a, std::vector<int32_t> b) {
    if (a.size() != b.size()) return false;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    return a == b;
  }

  // The all-reduced value of edge e's tensor: a placeholder until emit_collectives.
  int32_t all_reduce(int32_t e) {
    const int32_t tensor = p_.e_tensor[e];
    auto it = memo_allreduce_.find(tensor);
    if (it != memo_allreduce_.end()) return it->second;
    const int32_t id = placeholder(static_cast<int32_t>(request_edge_.size()));
    request_edge_.push_back(e);
    memo_allreduce_.emplace(tensor, id);
    return id;
  }

  // One collective task over `devs` on `bytes` (its inputs are wired by the caller).
  int32_t collective(const std::vector<int32_t>& devs, double bytes, int32_t op) {
    TaskGraph& g = *g_;
    const int32_t id = static_cast<int32_t>(g.duration.size());
    g.duration.push_back(allreduce_time(devs, bytes));
    // Collective streams of the members, plus the inter-machine links of the ring (it contends
    // with transfers there); NVLink/PCIe hops inside a machine are left to the streams.
    std::vector<int32_t> res;
    for (int32_t d : devs)
      if (dev_rep_[d] == d) res.push_back(p_.num_devices + d);
    std::vector<int32_t> ring(devs);
    std::sort(ring.begin(), ring.end(), [&](int32_t a, int32_t b) {
      return p_.dev_machine[a] != p_.dev_machine[b] ? p_.dev_machine[a] < p_.dev_machine[b] : a < b;
    });
    for (size_t k = 0; k < ring.size(); ++k) {
      const int32_t a = ring[k], b = ring[(k + 1) % ring.size()];
      if (p_.dev_machine[a] == p_.dev_machine[b]) continue;
      const size_t pair = static_cast<size_t>(a) * p_.num_devices + b;
      for (int32_t r = p_.link_res_ptr[pair]; r < p_.link_res_ptr[pair + 1]; ++r) {
        if (!link_simulated(p_.link_res[r])) continue;
        const int32_t rid = 2 * p_.num_devices + p_.link_res[r];
        if (std::find(res.begin(), res.end(), rid) == res.end()) res.push_back(rid);
      }
    }
    std::vector<int32_t> hosts;
    bool spans_machines = false;
    for (int32_t d : devs) {
      spans_machines = spans_machines || p_.dev_machine[d] != p_.dev_machine[devs[0]];
      if (p_.dev_host[d] >= 0 && std::find(hosts.begin(), hosts.end(), p_.dev_host[d]) == hosts.end())
        hosts.push_back(p_.dev_host[d]);
    }
    if (spans_machines)          // a ring through gRPC: serialisation on every process's executor
      for (int32_t h : hosts) res.push_back(host_resource(h));
    for (int32_t r : res) g.res.push_back(r);
    g.res_ptr.push_back(static_cast<int32_t>(g.res.size()));
    g.mem_device.push_back(-1);
    g.mem_bytes.push_back(0);
    task_device_.push_back(-1);
    if (meta_) {
      meta_->kind.push_back(kCollective);
      meta_->op.push_back(op);
      meta_->device.push_back(-1);
      meta_->src.push_back(-1);
    }
    for (int32_t d : devs) {     // same order on every member (the compiler's control chain)
      if (dev_rep_[d] != d) continue;
      edge(last_collective_[d], id, false);
      last_collective_[d] = id;
    }
    ++num_allreduces;
    return id;
  }

  // The sums on one device the data edges will ask for (full_on's AddN branch, predicted from the
  // layouts), bucketed and emitted now; memo_addn_ then hands each tensor its bucket's unpack.
  void plan_sums(int64_t cap) {
    std::vector<int32_t> edges, targets;
    std::unordered_map<int64_t, int32_t> seen;
    const int32_t E = static_cast<int32_t>(p_.e_src.size());
    for (int32_t e = 0; e < E; ++e) {
      const Layout& P = layouts_[op_layout_[p_.e_src[e]]];
      if (P.mode != kReplicated || p_.e_state[e] != kPartial) continue;
      const Layout& C = layouts_[op_layout_[p_.e_dst[e]]];
      const uint8_t need = C.mode == kReplicated ? p_.e_need[e] : kFull;
      int32_t agg = -1;
      if (need == kFull) {
        if (C.mode == kSingle) agg = C.devs[0];
        else if (!(P.option == kAllReduce && same_set(C.uniq, P.uniq) && P.uniq.size() > 1)) agg = P.devs[0];
      } else if (need == kSplit || (need == kPartial && P.devs != C.devs)) {
        agg = C.devs[0];
      }
      if (agg < 0) continue;
      if (P.micro > 1 && P.uniq.size() == 1 && P.uniq[0] == agg) continue;   // a stage's own sum: no AddN
      const int64_t key = static_cast<int64_t>(p_.e_tensor[e]) * p_.num_devices + agg;
      if (seen.emplace(key, e).second) {
        edges.push_back(e);
        targets.push_back(agg);
      }
    }
    for (const std::vector<int32_t>& bucket : assign_buckets(edges, targets, cap)) {
      if (bucket.size() == 1) continue;      // alone: full_on builds the plain AddN
      const int32_t e0 = edges[bucket[0]], agg = targets[bucket[0]];
      std::vector<int32_t> devs(layouts_[op_layout_[p_.e_src[e0]]].uniq);
      std::sort(devs.begin(), devs.end());
      int64_t bytes = 0;
      for (int32_t r : bucket) bytes += p_.t_bytes[p_.e_tensor[edges[r]]];
      const int32_t sum = add_task(kAddN, memcpy_time(agg, (devs.size() + 1.0) * bytes), agg, p_.e_src[e0], bytes, {agg});
      for (int32_t d : devs) {
        if (dev_rep_[d] != d) continue;
        const int32_t pack = add_task(kPack, memcpy_time(d, 2.0 * bytes), d, p_.e_src[e0], bytes, {d});
        for (int32_t r : bucket) edge(device_sum(edges[r], d), pack, true);
        edge(transfer(pack, agg, bytes), sum, true);
      }
      const int32_t unpack = add_task(kUnpack, memcpy_time(agg, 2.0 * bytes), agg, p_.e_src[e0], bytes, {agg});
      edge(sum, unpack, true);
      ++num_addns;
      for (int32_t r : bucket) {
        memo_addn_.emplace(static_cast<int64_t>(p_.e_tensor[edges[r]]) * p_.num_devices + agg, unpack);
        ++num_addn_tensors;
      }
    }
  }

  // Buckets of the reductions of edges[r] onto targets[r] (-2: all replicas), in issue order:
  // tag_tf.placement.fusion.assign_buckets, line for line.
  std::vector<std::vector<int32_t>> assign_buckets(const std::vector<int32_t>& edges,
                                                   const std::vector<int32_t>& targets, int64_t cap) const {
    const int32_t R = static_cast<int32_t>(edges.size());
    auto tensor = [&](int32_t r) { return p_.e_tensor[edges[r]]; };
    auto devices = [&](int32_t r) {
      std::vector<int32_t> d = layouts_[op_layout_[p_.e_src[edges[r]]]].uniq;
      std::sort(d.begin(), d.end());
      return d;
    };
    auto order_key = [&](int32_t r) { return std::pair{p_.t_level[tensor(r)], p_.t_rank[tensor(r)]}; };
    std::vector<int32_t> order(R);
    for (int32_t r = 0; r < R; ++r) order[r] = r;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return order_key(a) < order_key(b); });
    std::vector<std::vector<int32_t>> buckets;
    struct Open { std::vector<int32_t> devs; int32_t target, dtype, level; std::vector<int32_t> members; int64_t bytes; };
    std::vector<Open> open;
    for (int32_t r : order) {
      const int32_t t = tensor(r);
      if (cap <= 0 || !p_.t_fusable[t]) {
        buckets.push_back({r});
        continue;
      }
      const std::vector<int32_t> devs = devices(r);
      Open* b = nullptr;
      for (Open& o : open)
        if (o.target == targets[r] && o.dtype == p_.t_dtype[t] && o.level == p_.t_level[t] && o.devs == devs) b = &o;
      if (!b) {
        open.push_back({devs, targets[r], p_.t_dtype[t], p_.t_level[t], {}, 0});
        b = &open.back();
      }
      if (!b->members.empty() && b->bytes + p_.t_bytes[t] > cap) {
        buckets.push_back(std::move(b->members));
        b->members.clear();
        b->bytes = 0;
      }
      b->members.push_back(r);
      b->bytes += p_.t_bytes[t];
    }
    for (Open& o : open)
      if (!o.members.empty()) buckets.push_back(std::move(o.members));
    std::sort(buckets.begin(), buckets.end(), [&](const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
      return order_key(a.back()) < order_key(b.back());
    });
    return buckets;
  }

  void emit_collectives(int64_t cap, bool barrier) {
    num_allreduce_tensors = static_cast<int32_t>(request_edge_.size());
    if (request_edge_.empty()) return;
    // result[r][d]: the task after which request r's reduced value is on device d.
    std::vector<std::vector<int32_t>> result(request_edge_.size());
    const std::vector<int32_t> all(request_edge_.size(), -2);
    // Barrier (the compiler's GraphBuilder._barrier_control, line for line): the first collective
    // of each sync level on a device waits for every instance on that device producing a value of
    // that level; the per-device collective chain holds the rest back.
    std::map<std::pair<int32_t, int32_t>, std::vector<int32_t>> waits;   // (level, device) -> tasks
    if (barrier)
      for (int32_t e : request_edge_) {
        const int32_t src = p_.e_src[e];
        const Layout& P = layouts_[op_layout_[src]];
        for (int32_t k : P.emit) waits[{p_.t_level[p_.e_tensor[e]], P.devs[k]}].push_back(instance(src, k));
      }
    auto hold = [&](int32_t level, const std::vector<int32_t>& devs, int32_t task) {
      for (int32_t d : devs) {
        auto it = waits.find({level, d});
        if (it == waits.end()) continue;
        for (int32_t w : it->second) edge(w, task, false);
        waits.erase(it);
      }
    };
    for (const std::vector<int32_t>& bucket : assign_buckets(request_edge_, all, cap)) {
      const int32_t e0 = request_edge_[bucket[0]];
      const int32_t level = p_.t_level[p_.e_tensor[e0]];
      const Layout& P0 = layouts_[op_layout_[p_.e_src[e0]]];
      std::vector<int32_t> devs(P0.uniq);
      std::sort(devs.begin(), devs.end());
      if (bucket.size() == 1) {
        const int32_t c = collective(devs, static_cast<double>(p_.e_bytes[e0]), p_.e_src[e0]);
        if (P0.micro > 1)
          for (int32_t d : devs) edge(device_sum(e0, d), c, true);
        else
          for (int32_t k : P0.emit) edge(instance(p_.e_src[e0], k), c, true);
        hold(level, devs, c);
        result[bucket[0]].assign(p_.num_devices, c);
        continue;
      }
      int64_t bytes = 0;
      for (int32_t r : bucket) bytes += p_.t_bytes[p_.e_tensor[request_edge_[r]]];
      std::vector<int32_t> packs;
      for (int32_t d : devs) {
        if (dev_rep_[d] != d) continue;
        const int32_t pack = add_task(kPack, memcpy_time(d, 2.0 * bytes), d, p_.e_src[e0], bytes, {d});
        for (int32_t r : bucket) edge(device_sum(request_edge_[r], d), pack, true);
        packs.push_back(pack);
      }
      const int32_t c = collective(devs, static_cast<double>(bytes), p_.e_src[e0]);
      for (int32_t pack : packs) edge(pack, c, true);
      hold(level, devs, c);
      std::vector<int32_t> unpack(p_.num_devices, -1);
      for (int32_t d : devs) {
        if (dev_rep_[d] != d) continue;
        unpack[d] = add_task(kUnpack, memcpy_time(d, 2.0 * bytes), d, p_.e_src[e0], bytes, {d});
        edge(c, unpack[d], true);
      }
      for (int32_t r : bucket) result[r] = unpack;
    }
    for (const PendingEdge& pe : pending_) edge(result[pe.request][task_device_[pe.to]], pe.to, pe.data);
  }

  // The layout sharding the batch like `id` (same devices and counts): replicas of an AllReduce
  // group and of a PS group over the same devices take the same shards, so one split serves both
  // (as the compiler memoizes it: by devices and counts, not by option).
  int32_t shard_layout(int32_t id) const { return layouts_[id].shard >= 0 ? layouts_[id].shard : id; }

  // Shards of edge e's tensor laid out as `consumer` needs (one task per replica).
  const std::vector<int32_t>& split_of(int32_t e, int32_t consumer) {
    const int64_t key = static_cast<int64_t>(p_.e_tensor[e]) * (1 << 20) + shard_layout(consumer);
    auto it = memo_split_.find(key);
    if (it != memo_split_.end()) return it->second;
    const int32_t src = p_.e_src[e];
    const Layout& P = layouts_[op_layout_[src]];
    const Layout& C = layouts_[consumer];
    const uint8_t st = state_of(e, P);
    const int32_t at = (st == kFull && P.index_of(C.devs[0]) < 0) ? P.devs[0] : C.devs[0];
    const int64_t bytes = p_.e_bytes[e];
    const int32_t full = full_on(e, at, -1);
    const int32_t sp = add_task(kSplitTask, memcpy_time(at, 2.0 * bytes), at, src, bytes, {at});
    edge(full, sp, true);
    ++num_splits;
    std::vector<int32_t> pieces;   // by instance slot
    for (int32_t j : C.emit) pieces.push_back(transfer(sp, C.devs[j], bytes * C.counts[j] / p_.batch));
    return memo_split_.emplace(key, std::move(pieces)).first->second;
  }

  void emit_data_edges() {
    const int32_t E = static_cast<int32_t>(p_.e_src.size());
    for (int32_t e = 0; e < E; ++e) {
      const int32_t src = p_.e_src[e], dst = p_.e_dst[e];
      const int32_t pid = op_layout_[src], cid = op_layout_[dst];
      const Layout& P = layouts_[pid];
      const Layout& C = layouts_[cid];
      const uint8_t st = state_of(e, P);
      const uint8_t need = C.mode == kReplicated ? p_.e_need[e] : kFull;
      for (int32_t j : C.emit) {
        const int32_t consumer = instance(dst, j);
        const int32_t d = C.devs[j];
        switch (need) {
          case kSplit:
            if (st == kSplit && same_split(P, C)) edge(instance(src, j), consumer, true);
            else if (st == kSplit && lines_up(P, C))        // a stage's micro-batch to the next stage's
              edge(transfer(instance(src, j), d, static_cast<int64_t>(static_cast<double>(p_.e_bytes[e]) / p_.batch * C.counts[j])),
                   consumer, true);
            else if (st == kSplit && P.micro == C.micro && C.micro > 1)
              edge(split_by_microbatch(e, cid)[C.slot[j]], consumer, true);
            else edge(split_of(e, cid)[C.slot[j]], consumer, true);
            break;
          case kPartial:
            if (st == kPartial && P.mode == kReplicated && P.devs == C.devs) {
              edge(instance(src, j), consumer, true);
            } else {
              const int32_t full0 = full_on(e, C.devs[0], -1);
              if (j == 0) {
                edge(full0, consumer, true);
              } else {   // the other replicas add zeros (one per device: micro-batches share it)
                const int64_t zkey = static_cast<int64_t>(p_.e_tensor[e]) * p_.num_devices + d;
                auto zt = C.micro > 1 ? memo_zeros_.find(zkey) : memo_zeros_.end();
                if (zt != memo_zeros_.end()) {
                  edge(zt->second, consumer, true);
                  break;
                }
                const int32_t from = st == kFull ? full_on(e, d, -1) : (full0 < 0 ? -1 : transfer(full0, d, p_.e_bytes[e]));
                const int32_t z = add_task(kZeros, memcpy_time(d, static_cast<double>(p_.e_bytes[e])), d, src,
                                           p_.e_bytes[e], {d});
                ++num_zeros;
                edge(from, z, true);
                edge(z, consumer, true);
                if (C.micro > 1) memo_zeros_.emplace(zkey, z);
              }
            }
            break;
          case kLocal:
            if (st == kLocal && same_split(P, C)) edge(instance(src, j), consumer, true);
            break;
          default:     // a replica reads its own replica's copy (micro-batches of one device, loop frames)
            if (st == kFull && P.size() > 1 && P.devs == C.devs) edge(instance(src, j), consumer, true);
            else edge(full_on(e, d, cid), consumer, true);
        }
      }
    }
  }

  void emit_control_edges() {
    const size_t C = p_.c_src.size();
    for (size_t k = 0; k < C; ++k) {
      const int32_t a = p_.c_src[k], b = p_.c_dst[k];
      const Layout& la = layouts_[op_layout_[a]];
      const Layout& lb = layouts_[op_layout_[b]];
      // Same rule as the compiler (GraphBuilder._wire_control): same replicas, or replicas holding
      // the same rows (a pipeline's stages), pair up; otherwise every instance waits for every one.
      bool paired = la.size() > 1 && la.mode == lb.mode && (la.devs == lb.devs || lines_up(la, lb));
      if (paired)
        for (int32_t j : lb.emit) paired &= la.slot[j] >= 0;
      // Stages of different widths micro-batched alike: micro-batch m waits for micro-batch m.
      const bool by_micro = !paired && la.micro == lb.micro && la.micro > 1 && la.mode == kReplicated &&
                            lb.mode == kReplicated;
      if (paired) {
        for (int32_t j : lb.emit) edge(instance(a, j), instance(b, j), false);
      } else if (by_micro) {
        const int32_t ka = la.size() / la.micro, kb = lb.size() / lb.micro;
        for (int32_t j : lb.emit)
          for (int32_t i : la.emit)
            if (i / ka == j / kb) edge(instance(a, i), instance(b, j), false);
      } else {
        for (int32_t j : lb.emit)
          for (int32_t i : la.emit) edge(instance(a, i), instance(b, j), false);
      }
    }
  }

  // The pipeline schedule (GraphBuilder._gate_microbatches, same rule): per micro-batched layout
  // and device, the forward ops of micro-batch m reading nothing forward from the layout (entries)
  // wait for those of m - 1 no forward op of the layout reads (exits); a layout whose micro-batch 0
  // exits already depend on a later micro-batch is left alone.
  void gate_microbatches() {
    std::map<int32_t, std::vector<int32_t>> stage_ops;
    for (int32_t op = 0; op < p_.num_ops; ++op)
      if ((p_.op_flags[op] & kForward) && layouts_[op_layout_[op]].micro > 1) stage_ops[op_layout_[op]].push_back(op);
    if (stage_ops.empty()) return;
    std::vector<uint8_t> has_in(p_.num_ops, 0), has_out(p_.num_ops, 0);
    for (size_t e = 0; e < p_.e_src.size(); ++e) {
      const int32_t a = p_.e_src[e], b = p_.e_dst[e];
      if ((p_.op_flags[a] & kForward) && (p_.op_flags[b] & kForward) && op_layout_[a] == op_layout_[b]) {
        has_in[b] = 1;
        has_out[a] = 1;
      }
    }
    std::vector<std::vector<int32_t>> preds(g_->duration.size());
    for (size_t k = 0; k < edge_from_.size(); ++k) preds[edge_to_[k]].push_back(edge_from_[k]);
    for (const auto& [lid, ops] : stage_ops) {
      const Layout& L = layouts_[lid];
      const int32_t k = L.size() / L.micro;
      std::vector<int32_t> entries, exits;
      for (int32_t op : ops) {
        if (!has_in[op]) entries.push_back(op);
        if (!has_out[op]) exits.push_back(op);
      }
      std::vector<uint8_t> later(g_->duration.size(), 0), seen(g_->duration.size(), 0);
      for (int32_t op : ops)
        for (int32_t j = k; j < L.size(); ++j) later[instance(op, j)] = 1;
      std::vector<int32_t> stack;
      for (int32_t op : exits)
        for (int32_t i = 0; i < k; ++i) stack.push_back(instance(op, i));
      bool joined = false;
      while (!stack.empty() && !joined) {
        const int32_t t = stack.back();
        stack.pop_back();
        if (seen[t]) continue;
        seen[t] = 1;
        for (int32_t p : preds[t]) {
          if (later[p]) joined = true;
          stack.push_back(p);
        }
      }
      if (joined) continue;
      for (int32_t m = 1; m < L.micro; ++m)
        for (int32_t i = 0; i < k; ++i)
          for (int32_t x : exits)
            for (int32_t en : entries) {
              edge(instance(x, (m - 1) * k + i), instance(en, m * k + i), false);
              preds[instance(en, m * k + i)].push_back(instance(x, (m - 1) * k + i));   // later checks see it
            }
    }
  }

  // Successor CSR from the collected edges (counting sort by source, stable).
  void finish() {
    TaskGraph& g = *g_;
    const size_t n = g.duration.size(), m = edge_from_.size();
    g.succ_ptr.assign(n + 1, 0);
    for (int32_t f : edge_from_) ++g.succ_ptr[f + 1];
    for (size_t i = 0; i < n; ++i) g.succ_ptr[i + 1] += g.succ_ptr[i];
    g.succ.resize(m);
    g.succ_data.resize(m);
    std::vector<int32_t> fill(g.succ_ptr.begin(), g.succ_ptr.end() - 1);
    for (size_t k = 0; k < m; ++k) {
      const int32_t pos = fill[edge_from_[k]]++;
      g.succ[pos] = edge_to_[k];
      g.succ_data[pos] = edge_data_[k];
    }
  }
};

}  // namespace tag_sim
