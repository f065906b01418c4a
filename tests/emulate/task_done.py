"""How the tasks of an emulated-cluster test script end together: the chief writes a file when it is
done (the hosts share this machine's file system); every other task serves until it appears."""
import os
import time


def finish(done_file: str) -> None:
    with open(done_file, "w") as f:
        f.write("done")


def wait(done_file: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(done_file) and time.monotonic() < deadline:
        time.sleep(0.2)
