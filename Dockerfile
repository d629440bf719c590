# The one image every pipeline step runs in: the trainer, kfp (no install at pod start) and the shipped sample.
#   DOCKER_BUILDKIT=1 docker build --tag kfp-tf-multiworker:0.1.0 .       (make image)
# Its GPU variant, for training tasks on GPU nodes (docs/gpus.md): the same file with the requirements of
# requirements/gpu/ (tensorflow[and-cuda]: CUDA, cuDNN and NCCL from NVIDIA's PyPI wheels, no CUDA base image needed)
#   DOCKER_BUILDKIT=1 docker build --build-arg REQUIREMENTS=requirements/gpu --tag kfp-tf-multiworker:0.1.0-gpu .
#                                                                          (make image-gpu)
# BASE names the Python image to build on (a mirror of it, or a CI stand-in). The build may get a pip.conf, a CA
# bundle and apt sources as optional BuildKit secrets (`make e2e`'s CI tooling passes the build host's), so none of
# them ends up in a layer; without them pip and apt use the base image's defaults.
ARG BASE=python:3.11.7-slim-bookworm

# The dependencies, installed under /install and made smaller: tensorflow-cpu is the CPU build (0.6 GB less than
# tensorflow); tf-keras names `tensorflow` as its only dependency, which tensorflow-cpu provides under another name,
# so it goes in without dependencies; TensorFlow's C++ headers (0.27 GB) only build extensions; `strip` drops the
# symbol tables of TensorFlow's and Arrow's shared libraries (0.23 GB), which nothing reads at run time (the dynamic
# symbols stay; libraries that auditwheel patched, such as numpy's, break when stripped); bytecode is
# kept for TensorFlow and tf-keras only (what every training process imports first), the rest (0.15 GB) compiles in
# memory when imported (docs/cluster.md has the start-up times). REQUIREMENTS names the folder whose image.txt and
# image-no-deps.txt are installed; for the GPU variant the same line drops NVIDIA's C headers (nvidia/*/include, only
# for building against CUDA) and leaves NVIDIA's libraries as shipped: all but NCCL's come stripped, and stripping
# libnccl would save 55 MB of debug information (docs/gpus.md).
FROM ${BASE} AS dependencies
RUN --mount=type=secret,id=aptsources,target=/etc/apt/sources.list \
    apt-get update \
    && apt-get install -y --no-install-recommends binutils=2.40-2 \
    && rm -rf /var/lib/apt/lists/*
ARG REQUIREMENTS=requirements
COPY ${REQUIREMENTS}/ /requirements/
RUN --mount=type=secret,id=pipconf,target=/etc/pip.conf \
    --mount=type=secret,id=cacert,target=/etc/ssl/certs/build-ca.crt \
    pip install --no-cache-dir --prefix=/install -r /requirements/image.txt \
    && pip install --no-cache-dir --no-deps --prefix=/install -r /requirements/image-no-deps.txt \
    && rm -rf /install/lib/python3*/site-packages/tensorflow/include /install/lib/python3*/site-packages/nvidia/*/include \
    && find /install/lib/python3*/site-packages/tensorflow /install/lib/python3*/site-packages/pyarrow -type f \
        \( -name '*.so' -o -name '*.so.[0-9]*' \) -exec strip --strip-unneeded {} + \
    && find /install -depth -type d -name __pycache__ ! -path '*/site-packages/tensorflow/*' \
        ! -path '*/site-packages/tf_keras/*' -exec rm -rf {} +

FROM ${BASE}
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=1 \
    TRAINER_SAMPLE_DIR=/app/data/mnist-sample

WORKDIR /app
RUN groupadd --gid 1000 trainer && useradd --uid 1000 --gid trainer --create-home trainer
COPY --from=dependencies /install /usr/local

COPY pyproject.toml setup.cfg README.md ./
COPY trainer/ trainer/
COPY components/ components/
COPY pipelines/ pipelines/
COPY data/mnist-sample/ data/mnist-sample/
RUN --mount=type=secret,id=pipconf,target=/etc/pip.conf \
    --mount=type=secret,id=cacert,target=/etc/ssl/certs/build-ca.crt \
    pip install --no-cache-dir --no-deps /app

USER 1000:1000
