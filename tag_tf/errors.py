"""Errors users see. Each names the thing that is wrong (file, field, op, device, group)."""


class TagError(Exception):
    """Base class: a problem with the user's input or environment, reported in one clear line."""


class GraphError(TagError):
    """The input graph cannot be read or is not a training graph we can handle."""


class ModelError(TagError):
    """Unknown model name or bad model-builder arguments."""


class TopologyError(TagError):
    """A topology file or preset is malformed; the message names the field."""


class StrategyError(TagError):
    """A strategy does not fit the graph or the topology; the message names the group or device."""


class CompileError(TagError):
    """The compiler cannot produce an equivalent graph for this strategy."""


class ProfileError(TagError):
    """Profiling failed or the profile database is unusable."""


class ClusterError(TagError):
    """A server process is dead, unreachable or mis-configured; the message names the task."""


class DeadlineExceeded(TagError):
    """A pass ran past its deadline."""


class VerificationError(TagError):
    """`verify=True`: the distributed graph does not train like the original."""


class WeightsError(TagError):
    """A GNN weights file that cannot be used (missing, corrupt, or for another network)."""


class EmulationError(TagError):
    """An emulated cluster cannot be built here (not root, a missing kernel feature) or its file is wrong."""


class OptionsError(TagError):
    """An option given to `tag_tf.distribute` (or the Estimator wrapper) that can never work; the
    message names the option. `field` is its name."""

    def __init__(self, field: str, message: str):
        super().__init__(f"tag_tf.distribute({field}=...): {message}")
        self.field = field


_TF_FRAMING = ("Graph execution error", "Detected at node", "File ", "Node:", "From /job", "Original stack trace",
               "[[", "The error could be from a previous operation", "Restart your program")


def tf_reason(error: BaseException) -> str:
    """The line of a TensorFlow error that says what went wrong: an OpError's message opens with
    "Graph execution error:" and the Python stack where the node was defined; the reason comes after
    (a collective's shape mismatch, a missing kernel). The first line not of that framing, else the
    first line, else the error's type."""
    message = str(getattr(error, "message", None) or error).strip()
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if any(ln.startswith("Detected at node") for ln in lines):     # the stack where the node was defined
        start = next(k for k, ln in enumerate(lines) if ln.startswith("Detected at node"))
        end = next((k for k in range(start, len(lines)) if lines[k].startswith("Node:")), start)
        lines = lines[:start] + lines[end + 1:]
    reasons = [ln for ln in lines if not ln.startswith(_TF_FRAMING) and "root error(s) found" not in ln]
    return (reasons or lines or [type(error).__name__])[0]
