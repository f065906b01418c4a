// Discrete-event engine of the tag_tf simulator: header-only, no global state, no Python.
//
// The engine runs an already-expanded *task graph*: compute ops, transfers and collectives are all
// tasks. It implements the op scheduler the TAG paper describes (TensorFlow's default executor:
// one FIFO queue per device, an op is queued once all its inputs are ready) plus reference-counted
// tensor lifetimes for peak-memory estimation.
//
// ---------------------------------------------------------------------------------------------
// Input (GraphView, all arrays borrowed, CSR layout)
//   n tasks, R resources, D memory pools.
//   duration[n]            seconds, finite and >= 0.
//   res_ptr[n+1], res[]    resources task i holds for its whole duration: res[res_ptr[i]..res_ptr[i+1]).
//                          No resource may appear twice in one task. A task may hold none.
//   succ_ptr[n+1], succ[]  successors of task i; succ_data[e] = 1 if the successor reads task i's
//                          output buffer (memory edge), 0 for a pure ordering edge.
//   mem_device[n]          pool of task i's output buffer, -1 = no buffer (then mem_bytes[i] == 0).
//   mem_bytes[n]           size of that buffer, >= 0.
//   persistent_bytes[D]    resident all iteration (variables, optimizer slots).
//   capacity_bytes[D]      pool capacity; only used to flag OOM.
//
// Semantics (exact; the tests pin every rule down)
//   1. Readiness. A task is ready when all its predecessors have finished; its ready time is the
//      latest predecessor end (0 for a task without predecessors). Parallel edges count twice.
//   2. Resources. Every resource serves its tasks one at a time. Waiting tasks are queued on each
//      resource they hold, ordered by the global key (ready_time, task_id). A task starts at the
//      earliest moment >= its ready time at which it is at the head of the queue of *every*
//      resource it holds and all of them are free (all-or-nothing acquisition). Because every queue
//      uses the same global order, the globally smallest waiting task is at the head of all its
//      queues, so this can never deadlock. The task holds its resources until start + duration.
//      A task without resources starts at its ready time.
//   3. Same-timestamp rounds. Time advances from one distinct event time to the next. At time t the
//      engine works in rounds: (a) every task ending at t finishes (releasing resources, freeing
//      buffers, making successors ready at t); (b) ready tasks without resources and with zero
//      duration finish *within the same round*, recursively, so no-op barriers are transparent;
//      (c) the remaining tasks that became ready in this round are enqueued in task-id order;
//      (d) every task that can start now starts. Tasks of zero duration that hold resources end at
//      t and are finished in the next round at the same t. A started task is never preempted, so a
//      task that becomes ready in a later round at t can start after a larger-id task that became
//      ready in an earlier round at t (the only departure from pure (ready_time, id) order, and it
//      only arises behind zero-duration tasks that hold resources).
//   4. Memory. Task i's buffer is live over the half-open interval [start_i, free_i), where free_i
//      is the latest end among its data successors, or its own end if it has none. Hence at one
//      timestamp all frees happen before all allocations, and a buffer with free_i == start_i
//      (e.g. a zero-duration task nobody reads) is never counted. live_d(t) = sum of buffers in
//      pool d live at t; peak_bytes[d] = persistent_bytes[d] + max_t live_d(t);
//      oom[d] = peak_bytes[d] > capacity_bytes[d]. peak_time[d] is the first time the max is
//      reached (0 if the pool never holds a buffer).
//   5. Outputs. start/end/ready/free_time per task (NaN for tasks that never ran), makespan = max
//      end (0 for an empty graph), busy[r] = sum of durations of tasks holding r.
//   6. Cycles. If some task never becomes ready the run returns Status::kCycle (num_finished() < n)
//      instead of hanging; find_cycle() names one cycle.
//
// Cost per run: O(n + E + sum_i |res_i|) plus O(log m) per task for a heap over the m *running*
// tasks only (m <= R + resource-free tasks in flight) and a sort of each batch of tasks that become
// ready together. Per-resource queues are slices of one flat array. (A task that becomes ready in a
// later round at t is inserted behind same-time tasks in O(their number); this only happens behind
// zero-duration tasks that hold resources.) The Engine keeps its buffers between runs: a second run
// on a graph no larger than an earlier one allocates nothing. An Engine is not thread-safe: use one
// per thread. Measured: ~6 ms for 100k tasks on one core (benchmarks/engine_speed.py).
// ---------------------------------------------------------------------------------------------
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace tag_sim {

// Borrowed view of a task graph (see the header comment for the meaning of each array).
struct GraphView {
  int32_t num_tasks = 0;
  int32_t num_resources = 0;
  int32_t num_pools = 0;
  const double* duration = nullptr;          // [num_tasks]
  const int32_t* res_ptr = nullptr;          // [num_tasks + 1]
  const int32_t* res = nullptr;              // [res_len]
  int64_t res_len = 0;
  const int32_t* succ_ptr = nullptr;         // [num_tasks + 1]
  const int32_t* succ = nullptr;             // [succ_len]
  const uint8_t* succ_data = nullptr;        // [succ_len]
  int64_t succ_len = 0;
  const int32_t* mem_device = nullptr;       // [num_tasks]
  const int64_t* mem_bytes = nullptr;        // [num_tasks]
  const int64_t* persistent_bytes = nullptr; // [num_pools]
  const int64_t* capacity_bytes = nullptr;   // [num_pools]
};

// Owning task graph for C++ producers (e.g. the strategy expander): fill the vectors, call view().
struct TaskGraph {
  int32_t num_resources = 0;
  std::vector<double> duration;
  std::vector<int32_t> res_ptr{0};
  std::vector<int32_t> res;
  std::vector<int32_t> succ_ptr{0};
  std::vector<int32_t> succ;
  std::vector<uint8_t> succ_data;
  std::vector<int32_t> mem_device;
  std::vector<int64_t> mem_bytes;
  std::vector<int64_t> persistent_bytes;
  std::vector<int64_t> capacity_bytes;

  GraphView view() const {
    GraphView g;
    g.num_tasks = static_cast<int32_t>(duration.size());
    g.num_resources = num_resources;
    g.num_pools = static_cast<int32_t>(persistent_bytes.size());
    g.duration = duration.data();
    g.res_ptr = res_ptr.data();
    g.res = res.data();
    g.res_len = static_cast<int64_t>(res.size());
    g.succ_ptr = succ_ptr.data();
    g.succ = succ.data();
    g.succ_data = succ_data.data();
    g.succ_len = static_cast<int64_t>(succ.size());
    g.mem_device = mem_device.data();
    g.mem_bytes = mem_bytes.data();
    g.persistent_bytes = persistent_bytes.data();
    g.capacity_bytes = capacity_bytes.data();
    return g;
  }
};

// Checks everything Engine::run relies on. Returns "" when valid, otherwise one line naming the
// array and index at fault. Engine::run does not re-check (it is the hot loop): validate graphs
// from untrusted producers first, a malformed graph may read out of bounds.
inline std::string validate(const GraphView& g) {
  auto at = [](const char* arr, int64_t i) { return std::string(arr) + "[" + std::to_string(i) + "]"; };
  const int32_t n = g.num_tasks;
  if (n < 0) return "num_tasks must be >= 0";
  if (g.num_resources < 0) return "num_resources must be >= 0";
  if (g.num_pools < 0) return "num_pools must be >= 0";
  for (int32_t i = 0; i < n; ++i) {
    const double d = g.duration[i];
    if (!std::isfinite(d) || d < 0) return at("duration", i) + " = " + std::to_string(d) + " must be finite and >= 0";
  }
  // Both CSR structures share the same checks.
  auto check_ptr = [&](const char* name, const int32_t* ptr, int64_t len) -> std::string {
    if (ptr[0] != 0) return at(name, 0) + " must be 0";
    for (int32_t i = 0; i < n; ++i)
      if (ptr[i + 1] < ptr[i]) return at(name, i + 1) + " is smaller than " + at(name, i) + " (must be non-decreasing)";
    if (ptr[n] != len)
      return at(name, n) + " = " + std::to_string(ptr[n]) + " must equal the entry count " + std::to_string(len);
    return "";
  };
  if (auto e = check_ptr("res_ptr", g.res_ptr, g.res_len); !e.empty()) return e;
  if (auto e = check_ptr("succ_ptr", g.succ_ptr, g.succ_len); !e.empty()) return e;
  // Duplicate resources in one task would make it wait behind itself: detect with a stamp array.
  std::vector<int32_t> stamp(static_cast<size_t>(g.num_resources), -1);
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t k = g.res_ptr[i]; k < g.res_ptr[i + 1]; ++k) {
      const int32_t r = g.res[k];
      if (r < 0 || r >= g.num_resources)
        return at("res", k) + " = " + std::to_string(r) + " (task " + std::to_string(i) + ") is out of range [0, " +
               std::to_string(g.num_resources) + ")";
      if (stamp[r] == i) return at("res", k) + ": task " + std::to_string(i) + " lists resource " + std::to_string(r) + " twice";
      stamp[r] = i;
    }
  }
  for (int64_t e = 0; e < g.succ_len; ++e) {
    if (g.succ[e] < 0 || g.succ[e] >= n)
      return at("succ", e) + " = " + std::to_string(g.succ[e]) + " is out of range [0, " + std::to_string(n) + ")";
    if (g.succ_data[e] > 1) return at("succ_data", e) + " = " + std::to_string(g.succ_data[e]) + " must be 0 or 1";
  }
  for (int32_t i = 0; i < n; ++i) {
    const int32_t p = g.mem_device[i];
    if (p < -1 || p >= g.num_pools)
      return at("mem_device", i) + " = " + std::to_string(p) + " is out of range [-1, " + std::to_string(g.num_pools) + ")";
    if (g.mem_bytes[i] < 0) return at("mem_bytes", i) + " = " + std::to_string(g.mem_bytes[i]) + " must be >= 0";
    if (p == -1 && g.mem_bytes[i] != 0)
      return at("mem_bytes", i) + " = " + std::to_string(g.mem_bytes[i]) + " but mem_device[" + std::to_string(i) + "] = -1 (no pool)";
  }
  for (int32_t d = 0; d < g.num_pools; ++d) {
    if (g.persistent_bytes[d] < 0) return at("persistent_bytes", d) + " must be >= 0";
    if (g.capacity_bytes[d] < 0) return at("capacity_bytes", d) + " must be >= 0";
  }
  return "";
}

// One cycle of the graph as task ids in edge order (t0 -> t1 -> ... -> t0), or empty if acyclic.
// Only for error reporting: allocates freely.
inline std::vector<int32_t> find_cycle(const GraphView& g) {
  const int32_t n = g.num_tasks;
  std::vector<int32_t> pending(n, 0);
  for (int64_t e = 0; e < g.succ_len; ++e) ++pending[g.succ[e]];
  std::vector<int32_t> stack;
  for (int32_t i = 0; i < n; ++i)
    if (pending[i] == 0) stack.push_back(i);
  while (!stack.empty()) {  // Kahn: peel off everything that is not on or behind a cycle
    const int32_t a = stack.back();
    stack.pop_back();
    for (int32_t e = g.succ_ptr[a]; e < g.succ_ptr[a + 1]; ++e)
      if (--pending[g.succ[e]] == 0) stack.push_back(g.succ[e]);
  }
  int32_t v = -1;
  for (int32_t i = 0; i < n && v < 0; ++i)
    if (pending[i] > 0) v = i;
  if (v < 0) return {};
  // Every leftover task has a leftover predecessor, so walking predecessors must revisit a task.
  std::vector<int32_t> pred_ptr(n + 1, 0), pred(static_cast<size_t>(g.succ_len));
  for (int64_t e = 0; e < g.succ_len; ++e) ++pred_ptr[g.succ[e] + 1];
  for (int32_t i = 0; i < n; ++i) pred_ptr[i + 1] += pred_ptr[i];
  std::vector<int32_t> fill(pred_ptr.begin(), pred_ptr.end() - 1);
  for (int32_t a = 0; a < n; ++a)
    for (int32_t e = g.succ_ptr[a]; e < g.succ_ptr[a + 1]; ++e) pred[fill[g.succ[e]]++] = a;
  std::vector<int32_t> pos(n, -1), path;
  while (pos[v] < 0) {
    pos[v] = static_cast<int32_t>(path.size());
    path.push_back(v);
    int32_t next = -1;
    for (int32_t k = pred_ptr[v]; k < pred_ptr[v + 1] && next < 0; ++k)
      if (pending[pred[k]] > 0) next = pred[k];
    v = next;
  }
  std::vector<int32_t> cycle(path.begin() + pos[v], path.end());
  std::reverse(cycle.begin(), cycle.end());  // we walked edges backwards
  return cycle;
}

// A running task and the time it ends.
struct Event {
  double time;
  int32_t task;
};

// Binary min-heap of running tasks keyed by end time, over storage owned by the Engine (so that
// it is reused across runs). It only holds running tasks, at most one per resource plus the
// resource-free tasks in flight, so it stays small; it is still touched twice per task, so:
//  * push sifts up, which usually stops at once because a new task tends to end late;
//  * pop moves the hole down to a leaf taking the smaller child without a branch (a +inf
//    sentinel after the last element stands in for a missing right child), then sifts the former
//    last element up from there ("bottom-up" deletion), which again usually stops at once;
//  * comparisons look at the time only. Ties come out in any order: every task ending at t is
//    popped in the same batch, and nothing observable depends on the order within a batch (ready
//    tasks are re-sorted by id before they are queued).
// Storage must have room for size + 2 events (the caller sizes it to num_tasks + 2).
class EventHeap {
 public:
  explicit EventHeap(Event* storage) : v_(storage) { v_[0] = sentinel(); }
  bool empty() const { return n_ == 0; }
  double top_time() const { return v_[0].time; }  // +inf when empty
  void push(double time, int32_t task) {
    size_t i = n_++;
    v_[n_] = sentinel();
    while (i > 0) {
      const size_t parent = (i - 1) / 2;
      if (!(time < v_[parent].time)) break;
      v_[i] = v_[parent];
      i = parent;
    }
    v_[i] = {time, task};
  }
  int32_t pop() {
    const int32_t top = v_[0].task;
    const Event last = v_[--n_];
    v_[n_] = sentinel();
    size_t i = 0;
    for (size_t c = 1; c < n_; c = 2 * i + 1) {
      c += v_[c + 1].time < v_[c].time;  // v_[n_] is +inf, so c + 1 is always readable
      v_[i] = v_[c];
      i = c;
    }
    while (i > 0) {
      const size_t parent = (i - 1) / 2;
      if (!(last.time < v_[parent].time)) break;
      v_[i] = v_[parent];
      i = parent;
    }
    v_[i] = n_ == 0 ? sentinel() : last;
    return top;
  }

 private:
  static Event sentinel() { return {std::numeric_limits<double>::infinity(), -1}; }
  Event* v_;
  size_t n_ = 0;
};

enum class Status : int { kOk = 0, kCycle = 1 };

class Engine {
 public:
  // Simulates `g` (which must satisfy validate(g)). Results stay valid until the next run.
  Status run(const GraphView& g);

  const std::vector<double>& start() const { return start_; }
  const std::vector<double>& end() const { return end_; }
  const std::vector<double>& ready() const { return ready_; }
  const std::vector<double>& free_time() const { return free_time_; }
  const std::vector<double>& busy() const { return busy_; }
  const std::vector<int64_t>& peak_bytes() const { return peak_bytes_; }
  const std::vector<double>& peak_time() const { return peak_time_; }
  const std::vector<uint8_t>& oom() const { return oom_; }
  double makespan() const { return makespan_; }
  int32_t num_finished() const { return num_finished_; }

 private:
  void prepare(const GraphView& g);
  void mark_never_ran(const GraphView& g);

  // Outputs.
  std::vector<double> start_, end_, ready_, free_time_, busy_, peak_time_;
  std::vector<int64_t> peak_bytes_;
  std::vector<uint8_t> oom_;
  double makespan_ = 0.0;
  int32_t num_finished_ = 0;

  // Scratch, kept between runs. Every list has a known bound (n tasks, R resources, D pools) and is
  // sized once in prepare(): the hot loop then writes through raw pointers and never calls an
  // out-of-line growth path, which would force the compiler to reload every pointer after it.
  std::vector<int32_t> pending_;      // per task: unfinished predecessors
  std::vector<int32_t> refs_;         // per finished task: data successors not yet finished
  // Buffers each task reads, as intrusive lists over the data edges: when producer a finishes,
  // every data edge e = (a -> c) is pushed on c's list (read_head_[c], then link_[e].next ...), so
  // that c can drop its references when it finishes. This replaces a predecessor CSR, which would
  // cost two more passes over all edges per run; here the work happens on cache-hot data.
  struct ReadLink {
    int32_t next;      // next edge on the same reader's list, -1 at the end
    int32_t producer;  // task whose buffer is read
  };
  std::vector<int32_t> read_head_;
  std::vector<ReadLink> link_;
  // Queue of resource r = the slice q_buf_[q_ptr_[r] .. q_ptr_[r+1]) with live part [head, tail):
  // every task enters each of its resources' queues exactly once, so slices never overflow.
  std::vector<int32_t> q_ptr_, q_buf_, q_head_, q_tail_;
  std::vector<int32_t> holder_;       // per resource: running task, -1 if free
  // Resources freed or given a task in this round, and pools that allocated at the current
  // timestamp. Duplicates are allowed (re-checking is harmless and cheaper than de-duplicating), so
  // the bounds are R + res_len entries per round and n allocations per timestamp.
  std::vector<int32_t> dirty_, pools_;
  std::vector<int64_t> live_, peak_live_;
  std::vector<Event> heap_;
  std::vector<int32_t> ready_list_;   // became ready in this round, not yet admitted
  std::vector<int32_t> admit_;        // of those, the ones that hold resources
};

// Resets outputs and builds the per-run scratch (predecessor counts, reader lists, queue slices).
// assign()/resize() keep capacity, so a run on a graph no larger than an earlier one allocates
// nothing.
inline void Engine::prepare(const GraphView& g) {
  const int32_t n = g.num_tasks, R = g.num_resources, D = g.num_pools;
  // start/end/ready/free_time are written for every task that runs; only a cyclic graph leaves
  // holes, and mark_never_ran() fills those with NaN, so they need no initialisation here.
  start_.resize(n);
  end_.resize(n);
  ready_.resize(n);
  free_time_.resize(n);
  busy_.assign(R, 0.0);
  peak_time_.assign(D, 0.0);
  peak_bytes_.assign(D, 0);
  oom_.assign(D, 0);
  makespan_ = 0.0;
  num_finished_ = 0;

  pending_.assign(n, 0);
  for (int64_t e = 0; e < g.succ_len; ++e) ++pending_[g.succ[e]];
  refs_.resize(n);  // set when each task finishes
  read_head_.assign(n, -1);
  link_.resize(static_cast<size_t>(g.succ_len));

  q_ptr_.assign(static_cast<size_t>(R) + 1, 0);
  for (int64_t k = 0; k < g.res_len; ++k) ++q_ptr_[g.res[k] + 1];
  for (int32_t r = 0; r < R; ++r) q_ptr_[r + 1] += q_ptr_[r];
  q_buf_.resize(static_cast<size_t>(g.res_len));
  q_head_.assign(q_ptr_.begin(), q_ptr_.end() - 1);
  q_tail_.assign(q_ptr_.begin(), q_ptr_.end() - 1);
  holder_.assign(R, -1);
  dirty_.resize(static_cast<size_t>(R) + static_cast<size_t>(g.res_len));
  live_.assign(D, 0);
  peak_live_.assign(D, 0);
  pools_.resize(n);
  heap_.resize(static_cast<size_t>(n) + 2);
  ready_list_.resize(n);
  admit_.resize(n);
}

inline Status Engine::run(const GraphView& g) {
  prepare(g);
  const int32_t n = g.num_tasks;

  // Everything the loop touches, as restrict-qualified locals (distinct buffers by construction).
  const double* __restrict duration = g.duration;
  const int32_t* __restrict res_ptr = g.res_ptr;
  const int32_t* __restrict res = g.res;
  const int32_t* __restrict succ_ptr = g.succ_ptr;
  const int32_t* __restrict succ = g.succ;
  const int32_t* __restrict mem_device = g.mem_device;
  const int64_t* __restrict mem_bytes = g.mem_bytes;
  double* __restrict start = start_.data();
  double* __restrict end = end_.data();
  double* __restrict ready = ready_.data();
  double* __restrict free_time = free_time_.data();
  double* __restrict busy = busy_.data();
  double* __restrict peak_time = peak_time_.data();
  int32_t* __restrict pending = pending_.data();
  int32_t* __restrict refs = refs_.data();
  const uint8_t* __restrict succ_data = g.succ_data;
  int32_t* __restrict read_head = read_head_.data();
  ReadLink* __restrict link = link_.data();
  int32_t* __restrict q_buf = q_buf_.data();
  int32_t* __restrict q_head = q_head_.data();
  int32_t* __restrict q_tail = q_tail_.data();
  int32_t* __restrict holder = holder_.data();
  int32_t* __restrict dirty = dirty_.data();
  int64_t* __restrict live = live_.data();
  int64_t* __restrict peak_live = peak_live_.data();
  int32_t* __restrict pools = pools_.data();
  int32_t* __restrict ready_list = ready_list_.data();
  int32_t* __restrict admit = admit_.data();
  EventHeap heap(heap_.data());
  int32_t num_dirty = 0, num_pools = 0, num_ready = 0, num_finished = 0;

  auto free_buffer = [&](int32_t task, double t) {
    free_time[task] = t;
    const int32_t p = mem_device[task];
    if (p >= 0) live[p] -= mem_bytes[task];
  };
  // Starts `task` at t: times and its buffer's allocation (resources are the caller's business).
  auto begin = [&](int32_t task, double t) {
    start[task] = t;
    end[task] = t + duration[task];
    const int32_t p = mem_device[task];
    if (p >= 0) {
      live[p] += mem_bytes[task];
      pools[num_pools++] = p;
    }
  };
  // Ends `task` at t: releases resources, drops buffer references, readies successors.
  auto finish = [&](int32_t task, double t) {
    ++num_finished;
    for (int32_t k = res_ptr[task]; k < res_ptr[task + 1]; ++k) {
      holder[res[k]] = -1;
      dirty[num_dirty++] = res[k];
    }
    for (int32_t e = read_head[task]; e >= 0; e = link[e].next) {
      const int32_t a = link[e].producer;
      if (--refs[a] == 0) free_buffer(a, t);
    }
    // Readers start only after this task ends, so none has finished yet: the buffer's refcount is
    // its number of data successors, and with none it dies now.
    int32_t readers = 0;
    for (int32_t e = succ_ptr[task]; e < succ_ptr[task + 1]; ++e) {
      const int32_t c = succ[e];
      if (succ_data[e]) {
        link[e] = {read_head[c], task};
        read_head[c] = e;
        ++readers;
      }
      if (--pending[c] == 0) ready_list[num_ready++] = c;
    }
    refs[task] = readers;
    if (readers == 0) free_buffer(task, t);
  };

  // Rules 3b, 3c: the tasks that became ready at t start at once when they need no resource, else
  // join each resource's queue, kept ordered by (ready time, id).
  auto admit_ready = [&](double t) {
    int32_t num_admit = 0;
    // Index loop: finishing a zero-duration task appends to ready_list while we walk it.
    for (int32_t i = 0; i < num_ready; ++i) {
      const int32_t b = ready_list[i];
      ready[b] = t;
      if (res_ptr[b] != res_ptr[b + 1]) {
        admit[num_admit++] = b;
      } else {
        begin(b, t);  // no resources: nothing to wait for
        if (duration[b] == 0.0)
          finish(b, t);
        else
          heap.push(end[b], b);
      }
    }
    num_ready = 0;
    if (num_admit > 1) std::sort(admit, admit + num_admit);
    for (int32_t i = 0; i < num_admit; ++i) {
      const int32_t b = admit[i];
      for (int32_t k = res_ptr[b]; k < res_ptr[b + 1]; ++k) {
        const int32_t r = res[k];
        // Everything queued is ready at <= t, so only same-time tasks with a larger id (queued in
        // an earlier round at t) can be passed.
        int32_t j = q_tail[r]++;
        while (j > q_head[r]) {
          const int32_t prev = q_buf[j - 1];
          if (ready[prev] < t || prev < b) break;
          q_buf[j] = prev;
          --j;
        }
        q_buf[j] = b;
        dirty[num_dirty++] = r;
      }
    }
  };
  // Rule 2: start every queue head whose resources are all free and headed by it. Only a resource
  // freed or given a task this round can have a newly startable head. Starting a task makes its
  // resources busy, so one pass suffices, in any order: two startable heads never share a resource.
  auto start_heads = [&](double t) {
    for (int32_t i = 0; i < num_dirty; ++i) {
      const int32_t r = dirty[i];
      if (holder[r] >= 0 || q_head[r] == q_tail[r]) continue;
      const int32_t h = q_buf[q_head[r]];
      if (res_ptr[h + 1] - res_ptr[h] > 1) {  // r is free and h heads it: check h's other resources
        bool can_start = true;
        for (int32_t k = res_ptr[h]; k < res_ptr[h + 1]; ++k) {
          const int32_t s = res[k];  // h waits on s, so s's queue is non-empty
          can_start &= (holder[s] < 0) & (q_buf[q_head[s]] == h);
        }
        if (!can_start) continue;
      }
      const double d = duration[h];
      for (int32_t k = res_ptr[h]; k < res_ptr[h + 1]; ++k) {
        const int32_t s = res[k];
        holder[s] = h;
        ++q_head[s];
        busy[s] += d;
      }
      begin(h, t);
      heap.push(end[h], h);
    }
    num_dirty = 0;
  };
  // Rule 4, once all rounds at t are done: live[] counts exactly the buffers live over
  // [t, next event); only pools that allocated at t can have risen.
  auto sample_peaks = [&](double t) {
    for (int32_t i = 0; i < num_pools; ++i) {
      const int32_t p = pools[i];
      if (live[p] > peak_live[p]) {
        peak_live[p] = live[p];
        peak_time[p] = t;
      }
    }
    num_pools = 0;
  };

  for (int32_t i = 0; i < n; ++i)
    if (pending[i] == 0) ready_list[num_ready++] = i;

  double t = 0.0;
  for (;;) {
    admit_ready(t);
    start_heads(t);
    // Next round at the same t (zero-duration tasks just started), or close t and advance.
    if (heap.top_time() == t) {
      while (heap.top_time() == t) finish(heap.pop(), t);
      continue;
    }
    sample_peaks(t);
    if (heap.empty()) break;
    t = heap.top_time();
    while (heap.top_time() == t) finish(heap.pop(), t);
  }

  num_finished_ = num_finished;
  makespan_ = num_finished > 0 ? t : 0.0;
  for (int32_t d = 0; d < g.num_pools; ++d) {
    peak_bytes_[d] = g.persistent_bytes[d] + peak_live_[d];
    oom_[d] = peak_bytes_[d] > g.capacity_bytes[d];
  }
  if (num_finished == n) return Status::kOk;
  mark_never_ran(g);
  return Status::kCycle;
}

// After a cyclic run: NaN for the times of tasks that never became ready, and for the free time of
// buffers that some never-run reader still holds.
inline void Engine::mark_never_ran(const GraphView& g) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int32_t i = 0; i < g.num_tasks; ++i) {
    if (pending_[i] > 0) start_[i] = end_[i] = ready_[i] = nan;
    if (pending_[i] > 0 || refs_[i] > 0) free_time_[i] = nan;
  }
}

}  // namespace tag_sim
