"""KFP v2 components, each a thin wrapper around one step of `trainer.steps`.

The plain functions live in one module each; `build(image)` turns them into components that all run in the
project's one image, with no pip install at pod start (kfp and the trainer are already in the image), and with the
contract's defaults and descriptions on their settings (`components.signatures`).
"""

from types import SimpleNamespace

from kfp import dsl

from components.create_cluster import create_cluster, create_ps_cluster
from components.deploy_model import deploy_model
from components.evaluate_model import evaluate
from components.prepare_data import prepare_data
from components.publish_model import publish_model
from components.signatures import declare
from components.train_ps import train_chief, train_server
from components.train_worker import train_worker

FUNCTIONS = (
    prepare_data,
    create_cluster,
    create_ps_cluster,
    train_worker,
    train_chief,
    train_server,
    evaluate,
    publish_model,
    deploy_model,
)


def build(image: str) -> SimpleNamespace:
    """Returns the components, each set to run in `image`."""
    return SimpleNamespace(
        **{f.__name__: dsl.component(declare(f), base_image=image, install_kfp_package=False) for f in FUNCTIONS}
    )
