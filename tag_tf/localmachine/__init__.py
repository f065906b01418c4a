"""The local machine model: this machine's TensorFlow runtime measured (op profiles, transfers,
collectives, conversions, per-step cost) and a Simulator that predicts real runs of compiled
strategies here with it. It drives real sessions and servers (runtime) and builds on the
simulator (sim), so it stands above both; benchmarks and `tag-tf plan --calibration local` use it.

    runtime   how it runs TensorFlow: pinned threads, Grappler off, setups and their sessions
    probes    what it measures, and the lines fitted to the samples
    model     LocalMachine, LocalSimulator, local_simulator(...)
"""
