# Dataflow custom worker container for the DP-CDA release job.
# The base is Beam's Python 3.11 SDK image matching the pinned apache-beam; torch from PyPI is its CUDA build,
# so mixing runs on the worker's GPU when the job asks for one (worker_accelerator), else on the CPU.
# Build with the commit, and tag the image <version>-<commit> (docs/operations.md): the launcher refuses an image
# whose tag does not match it, and every worker checks the code it runs against the launcher's.
FROM apache/beam_python3.11_sdk:2.77.0

ARG GIT_COMMIT=unknown
WORKDIR /opt/dpcda
COPY requirements.txt setup.py ./
# The SDK image already holds apache-beam[gcp]==2.77.0; install the rest at the pinned versions.
RUN grep -v '^apache-beam' requirements.txt > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY dpcda/ dpcda/
RUN echo "COMMIT = \"${GIT_COMMIT}\"" > dpcda/storage/_build.py \
    && pip install --no-cache-dir --no-deps . \
    && pip check

# Beam's worker boot program stays the entry point (the launcher runs `dpcda release` elsewhere).
ENTRYPOINT ["/opt/apache/beam/boot"]
