"""The package's version, written here and nowhere else: ``dpcda.__version__``, the build check's ``VERSION``
(``storage.build``, which the manifest and the worker image tag read through ``dpcda.pipeline.__version__``) and
setup.py (which reads this file as text, without importing the package) all take it from here."""

__version__ = "0.2.0"
