"""tag_tf: topology-aware deployment of TF1 training graphs on heterogeneous GPU clusters."""
import glob
import os

# pybind11 comes from pyproject's build requirements (and the dev extra, for in-place rebuilds).
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import find_packages, setup

# Exact pins: measured to install together on Python 3.11 (`pip check` clean).
CORE = [
    "tensorflow-estimator==2.15.0",
    "torch==2.13.0",
    "torch-geometric==2.8.1",
    "pymetis==2025.2.2",
    "pyscipopt==6.3.0",
    "tf-slim==1.1.0",
    "numpy==1.26.4",
    "protobuf==4.25.8",
    "PyYAML==6.0.3",
    "matplotlib==3.11.2",
    "tqdm==4.70.1",
]
# TensorFlow build: the CPU wheel by default. An extra cannot remove a requirement, so GPU users
# set TAG_TF_GPU=1 and take the `gpu` extra:  TAG_TF_GPU=1 pip install -e .[gpu]
TF = [] if os.environ.get("TAG_TF_GPU") == "1" else ["tensorflow-cpu==2.15.1"]

ext_modules = [
    Pybind11Extension(
        "tag_tf._simcore",
        sorted(glob.glob(os.path.join("kernels", "*.cpp"))),
        include_dirs=["kernels"],
        depends=sorted(glob.glob(os.path.join("kernels", "*.h"))),   # rebuild when a header changes
        cxx_std=17,
        extra_compile_args=["-O3"],
    )
]
cmdclass = {"build_ext": build_ext}

setup(
    name="tag_tf",
    version="0.1.0",
    description="Topology-aware graph deployment of TF1 training graphs on heterogeneous GPU clusters",
    packages=find_packages(include=["tag_tf", "tag_tf.*"]),
    package_data={"tag_tf": ["topology/presets/*.yaml", "profile/data/*.json", "search/weights/gnn.*"]},
    python_requires=">=3.11,<3.12",
    install_requires=CORE + TF,
    extras_require={
        "gpu": ["tensorflow[and-cuda]==2.15.1"],
        "dev": ["pytest==9.2.0", "pytest-timeout==2.4.0", "pybind11==3.1.0", "ruff==0.8.4", "mypy==1.13.0",
                "import-linter==2.5.2", "grimp==3.20"],
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    entry_points={"console_scripts": ["tag-tf=tag_tf.frontend.cli:main"]},
)
