"""The local machine model: this machine's TensorFlow runtime measured (op profiles, transfers,
collectives, conversions, per-step cost, replicas side by side) and a Simulator that predicts real
runs of compiled strategies here with it. It drives real sessions and servers (runtime) and builds
on the simulator (sim), so it stands above both; benchmarks and `tag-tf plan --calibration local`
use it.

    runtime    how it runs TensorFlow: the runtimes (pinned threads, or TensorFlow's defaults),
               setups and their sessions
    probes     what it measures in one process or through one client, and the lines fitted to it
    tasksteps  a step's own cost on TF_CONFIG-like tasks (each process its own server)
    corun      a graph's step while every device of a setup runs a replica side by side
    helpers    the other processes those two measurements need
    model      LocalMachine, LocalSimulator, local_simulator(...)
"""
