# The one image every pipeline step runs in: the trainer, kfp (no install at pod start) and the shipped sample.
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
RUN pip install --no-cache-dir -r requirements/image.txt

COPY pyproject.toml setup.cfg README.md ./
COPY trainer/ trainer/
COPY components/ components/
COPY pipelines/ pipelines/
COPY data/mnist-sample/ data/mnist-sample/
RUN pip install --no-cache-dir --no-deps /app

USER 1000:1000
