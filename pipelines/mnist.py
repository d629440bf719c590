"""The MNIST pipeline's command line: compile it, run it here, or upload, run and schedule it on a KFP server.

    python pipelines/mnist.py --compile --image REGISTRY/kfp-tf-multiworker:0.1.0 --output mnist_pipeline.yaml
    python pipelines/mnist.py --local --num-workers 2
    python pipelines/mnist.py --upload --image REGISTRY/kfp-tf-multiworker:0.1.0 --host $KF_PIPELINES_ENDPOINT
    KFP_TF_IMAGE=REGISTRY/kfp-tf-multiworker:0.1.0 kfp dsl compile --py pipelines/mnist.py --output mnist_pipeline.yaml

`python pipelines/mnist.py --compile --help` (or --local, --upload, ...) lists only that action's options.
"""

import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.cli import IMAGE_ENV, main, pipeline_from_env


def __getattr__(name: str) -> Any:
    """`mnist_pipeline` for `kfp dsl compile --py`: the pipeline in the image `$KFP_TF_IMAGE` (required)."""
    if name == "mnist_pipeline":
        return pipeline_from_env()
    raise AttributeError(name)


def __dir__() -> list[str]:
    return sorted([*globals(), "mnist_pipeline"])


__all__ = ["IMAGE_ENV", "main"]

if __name__ == "__main__":
    sys.exit(main())
