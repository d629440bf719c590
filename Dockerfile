# The one image every pipeline step runs in: the trainer, kfp (no install at pod start) and the shipped sample.
# Needs BuildKit. pip may get a pip.conf and a CA bundle as optional build secrets (`make image` passes the
# host's), so they never end up in a layer; without them pip uses its defaults.
FROM python:3.11.7-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    TRAINER_SAMPLE_DIR=/app/data/mnist-sample

WORKDIR /app
RUN groupadd --gid 1000 trainer && useradd --uid 1000 --gid trainer --create-home trainer

# Dependencies first, so a code change does not reinstall TensorFlow.
COPY requirements/image.txt requirements/image.txt
RUN --mount=type=secret,id=pipconf,target=/etc/pip.conf \
    --mount=type=secret,id=cacert,target=/etc/ssl/certs/build-ca.crt \
    pip install --no-cache-dir -r requirements/image.txt

COPY pyproject.toml setup.cfg README.md ./
COPY trainer/ trainer/
COPY components/ components/
COPY pipelines/ pipelines/
COPY data/mnist-sample/ data/mnist-sample/
RUN --mount=type=secret,id=pipconf,target=/etc/pip.conf \
    --mount=type=secret,id=cacert,target=/etc/ssl/certs/build-ca.crt \
    pip install --no-cache-dir --no-deps /app

USER 1000:1000
