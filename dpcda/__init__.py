"""dpcda: differentially private synthetic data releases on Apache Beam."""

__version__ = "0.2.0"
