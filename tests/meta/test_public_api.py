"""The public names: every name in `tag_tf.__all__` (and every submodule `dir(tag_tf)` lists) resolves
in a fresh interpreter, and the module docstring's pipeline example runs as written."""
from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fresh(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_every_public_name_resolves():
    p = _fresh("import tag_tf\nfor name in dir(tag_tf):\n    assert getattr(tag_tf, name) is not None, name\n"
               "print(len(tag_tf.__all__))")
    assert p.returncode == 0, p.stderr[-3000:]
    assert int(p.stdout.strip()) >= 15


def test_the_module_docstring_example_runs():
    import tag_tf

    blocks = re.findall(r"::\n\n((?:    .*\n|\n)+)", tag_tf.__doc__)
    example = "\n".join(line[4:] for line in blocks[-1].splitlines())
    assert "tag_tf.load_topology" in example and "compile_strategy" in example
    p = _fresh("import tag_tf\n" + example + "\nassert report.iteration_time_s > 0\nassert compiled.graph_def.node\n"
               "print('ok')")
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]
