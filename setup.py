"""Packaging for the DP-CDA release job (also used by Dataflow's --setup_file staging)."""

from setuptools import setup

setup(
    name="dpcda",
    version="0.1.0",
    description="Differentially private synthetic data release by class-centric mixing (DP-CDA) on Apache Beam",
    packages=["pipeline", "transforms", "mechanisms", "storage", "schemas", "privacy", "evaluation"],
    package_data={"schemas": ["manifest.schema.json"]},
    python_requires=">=3.10",
    install_requires=[
        "apache-beam[gcp]>=2.60,<3",
        "dp-accounting>=0.4",
        "pydantic>=2.5,<3",
        "pyarrow>=14,<26",
        "numpy>=1.24,<2.5",
        "protobuf<7",
        "pyyaml>=6",
        "tfrecord>=1.14",
        "matplotlib>=3.7",
        "tqdm>=4.60",
        "mpmath>=1.3",
        "scipy>=1.10",
        "threadpoolctl>=3.1",  # one BLAS thread for the per-record projection (mechanisms/rowwise.py)
        "daqp>=0.11",  # dense QP of seed 002's private sampling
        # torch is installed separately (a CPU wheel pinned in requirements.txt; CUDA in the Dockerfile)
    ],
    entry_points={"console_scripts": ["dpcda=pipeline.cli:main"]},
)
