"""Bad input to the pipeline CLI and to the component bodies: the same contract as the trainer CLIs (one `error:`
line naming the value and what is allowed, exit 2, nothing written); the cases join tests/test_bad_input.py's table.
"""

import math

from kfp.dsl import Artifact, Dataset, Markdown, Metrics, Model

import components
from pipelines import cli as pipeline_cli
from tests.support.pipelines import IMAGE

OPS = components.build(IMAGE)


def _pipeline(*argv, out=None):
    return pipeline_cli.main, list(argv), out


def _component(name, **kwargs):
    def call(argv):
        try:
            getattr(OPS, name).python_func(**kwargs)
        except SystemExit as exit_info:
            return exit_info.code
        return 0

    return call


def _evaluate(b, s, model, **settings):
    """The evaluate component on `model` (a directory under b) with its outputs under b/out."""
    return _component(
        "evaluate",
        dataset=Dataset(uri=s),
        models=[Model(uri=str(b / model))],
        metrics=Metrics(uri=str(b / "out" / "metrics")),
        classification_metrics=Artifact(uri=str(b / "out" / "cm")),
        report=Artifact(uri=str(b / "out" / "report")),
        chief_model=Model(uri=str(b / "out" / "chief")),
        **settings,
    )


def _deploy(b, out, **changes):
    settings = {"publish_uri": "gs://models/mnist", "serving_name": "mnist", "serving_timeout": 60.0, **changes}
    decision = Markdown(uri=str(b / "decision"), metadata={"latest_version": 7, "latest_path": "gs://models/mnist/7"})
    deployment = Markdown(uri=str(b / "out" / out))
    return _component(
        "deploy_model", decision=decision, deployment=deployment, serving_runtime_version="2.20.0", **settings
    )


PIPELINE_CASES = {
    # the pipeline CLI
    "compile without an image": lambda b, s: (
        *_pipeline("--compile", "--output", str(b / "out" / "p1.yaml"), out="p1.yaml"),
        "no image: pass --image REGISTRY/kfp-tf-multiworker:",
    ),
    "image reference invalid": lambda b, s: (
        *_pipeline("--compile", "--image", "Team/Image:1", "--output", str(b / "out" / "p2.yaml"), out="p2.yaml"),
        "image 'Team/Image:1' is not a valid image reference",
    ),
    "GPU count negative": lambda b, s: (
        *_pipeline("--compile", "--image", IMAGE, "--gpus=-1", "--output", str(b / "out" / "p3.yaml"), out="p3.yaml"),
        "gpus -1 is not allowed; allowed: a whole number from 0 to 16",
    ),
    "CPU request not a quantity": lambda b, s: (
        *_pipeline(
            "--compile",
            "--image",
            IMAGE,
            "--cpu-request",
            "lots",
            "--output",
            str(b / "out" / "p4.yaml"),
            out="p4.yaml",
        ),
        "cpu_request 'lots' is not allowed",
    ),
    "retries above maximum": lambda b, s: (
        *_pipeline(
            "--compile", "--image", IMAGE, "--retries", "11", "--output", str(b / "out" / "p5.yaml"), out="p5.yaml"
        ),
        "retries 11 is not allowed; allowed: 0 to 10",
    ),
    "compile to a non-YAML file": lambda b, s: (
        *_pipeline("--compile", "--image", IMAGE, "--output", str(b / "out" / "p.json"), out="p.json"),
        "must end with .yaml or .yml",
    ),
    "storage secret not a name": lambda b, s: (
        *_pipeline(
            "--compile", "--image", IMAGE, "--storage-secret", "My_Secret", "--output", str(b / "out" / "p6.yaml")
        ),
        "storage_secret 'My_Secret' is not allowed; allowed: a Secret name",
    ),
    "storage secret keys without variables": lambda b, s: (
        *_pipeline(
            "--compile", "--image", IMAGE, "--storage-secret-keys", "accesskey", "--output", str(b / "out" / "p7.yaml")
        ),
        "storage_secret_keys 'accesskey' is not allowed; allowed: KEY=ENV pairs",
    ),
    "checkpoint volume for the parameter-server pipeline": lambda b, s: (
        *_pipeline(
            "--compile",
            "--image",
            IMAGE,
            "--strategy",
            "parameter_server",
            "--checkpoint-volume",
            "ckpt",
            "--output",
            str(b / "out" / "p8.yaml"),
        ),
        "--checkpoint-volume is not allowed with --strategy parameter_server",
    ),
    "local run with three workers": lambda b, s: (
        *_pipeline("--local", "--num-workers", "3", "--output-dir", str(b / "out" / "run1"), out="run1"),
        "--num-workers 3 is not allowed; allowed: 1 to 2 with --local",
    ),
    "local run gate above 1": lambda b, s: (
        *_pipeline("--local", "--min-accuracy", "1.5", "--output-dir", str(b / "out" / "run2"), out="run2"),
        "min_accuracy 1.5 is not allowed; allowed: a number from 0 to 1",
    ),
    "local run gate without a direction": lambda b, s: (
        *_pipeline("--local", "--gate", "auc>0.9", "--output-dir", str(b / "out" / "run3"), out="run3"),
        "gate 'auc>0.9' is not allowed; allowed: empty (accuracy >= min_accuracy), or METRIC>=VALUE or METRIC<=VALUE",
    ),
    "local run model_fn without a function": lambda b, s: (
        *_pipeline("--local", "--model-fn", "mymodel", "--output-dir", str(b / "out" / "run4"), out="run4"),
        "model_fn 'mymodel' is not allowed; allowed: empty or package.module:function",
    ),
    "evaluate step gate without a bound": lambda b, s: (
        _evaluate(b, s, "no-history", min_accuracy=0.5, gate="loss<="),
        [],
        "chief",
        "gate 'loss<=' is not allowed; allowed: empty (accuracy >= min_accuracy)",
    ),
    "local run data from a function without model_fn": lambda b, s: (
        *_pipeline("--local", "--source", "fn:m:f", "--output-dir", str(b / "out" / "run5"), out="run5"),
        "source 'fn:m:f' is not allowed without model_fn: the built-in CNN trains on images",
    ),
    "local run gate on a metric the CNN lacks": lambda b, s: (
        *_pipeline("--local", "--gate", "auc>=0.9", "--output-dir", str(b / "out" / "run6"), out="run6"),
        "gate 'auc>=0.9' is not allowed with the built-in CNN, which reports accuracy and loss",
    ),
    "run parameter out of range": lambda b, s: (
        *_pipeline("--run", "--image", IMAGE, "--host", "http://127.0.0.1:9", "--param", "epochs=0"),
        "epochs 0 is not allowed",
    ),
    "run parameter unknown": lambda b, s: (
        *_pipeline("--run", "--image", IMAGE, "--host", "http://127.0.0.1:9", "--param", "epoch=3"),
        "--param 'epoch' is not a parameter of this pipeline",
    ),
    "schedule with five cron fields": lambda b, s: (
        *_pipeline("--schedule", "0 2 * * *", "--image", IMAGE, "--host", "http://127.0.0.1:9"),
        "KFP cron has 6 with seconds first: '0 0 2 * * *'",
    ),
    # component bodies
    "prepare step source": lambda b, s: (
        _component(
            "prepare_data",
            dataset=Dataset(uri=str(b / "out" / "ds")),
            source="ftp://x",
            max_train_examples=0,
            max_test_examples=0,
            num_shards=4,
        ),
        [],
        "ds",
        "source 'ftp://x' is not allowed",
    ),
    "cluster step without workers": lambda b, s: (
        _component(
            "create_cluster",
            cluster=Artifact(uri=str(b / "out" / "c1")),
            run_id="r",
            num_workers=0,
            cluster_mode="local",
            port=2222,
        ),
        [],
        "c1",
        "num_workers 0 is not allowed; allowed: an integer from 1 to 64",
    ),
    "cluster step mode unknown": lambda b, s: (
        _component(
            "create_cluster",
            cluster=Artifact(uri=str(b / "out" / "c2")),
            run_id="r",
            num_workers=2,
            cluster_mode="docker",
            port=2222,
        ),
        [],
        "c2",
        "cluster_mode 'docker' is not allowed; allowed: kubernetes, local",
    ),
    "worker step epochs NaN": lambda b, s: (
        _component(
            "train_worker",
            dataset=Dataset(uri=s),
            cluster=Artifact(uri=str(b / "cluster")),
            worker_index=0,
            model=Model(uri=str(b / "out" / "m9")),
            run_id="r",
            epochs=1,
            batch_size=64,
            learning_rate=math.nan,
            startup_timeout=60.0,
            unschedulable_timeout=60.0,
            collective_timeout=0.0,
            max_restarts=0,
            checkpoint_dir="",
            cluster_mode="local",
        ),
        [],
        "m9",
        "learning_rate nan is not allowed",
    ),
    "evaluate step gate NaN": lambda b, s: (
        _evaluate(b, s, "not-a-model", min_accuracy=math.nan),
        [],
        "chief",
        "min_accuracy nan is not allowed",
    ),
    "evaluate step on a model without its history": lambda b, s: (
        _evaluate(b, s, "no-history", min_accuracy=0.5),
        [],
        "chief",
        "/no-history' has no history.json; allowed: a directory the trainer's chief wrote",
    ),
    "publish step on a model without its history": lambda b, s: (
        _component(
            "publish_model",
            model=Model(uri=str(b / "no-history")),
            metrics=Metrics(uri=str(b / "m")),
            decision=Markdown(uri=str(b / "out" / "d")),
            publish_uri=str(b / "out" / "published"),
        ),
        [],
        "d",
        "/no-history' has no history.json; allowed: a directory the trainer's chief wrote",
    ),
    "publish step without a location": lambda b, s: (
        _component(
            "publish_model",
            model=Model(uri=str(b / "not-a-model")),
            metrics=Metrics(uri=str(b / "m")),
            decision=Markdown(uri=str(b / "out" / "d")),
            publish_uri="",
        ),
        [],
        "d",
        "publish_uri is empty",
    ),
    "publish step to an unknown scheme": lambda b, s: (
        _component(
            "publish_model",
            model=Model(uri=str(b / "not-a-model")),
            metrics=Metrics(uri=str(b / "m")),
            decision=Markdown(uri=str(b / "out" / "d2")),
            publish_uri="hdfs://nn/models",
        ),
        [],
        "d2",
        "publish_uri 'hdfs://nn/models' is not allowed; allowed: empty, a local or volume path, s3://BUCKET/PREFIX",
    ),
    "publish step endpoint without a scheme": lambda b, s: (
        _component(
            "publish_model",
            model=Model(uri=str(b / "not-a-model")),
            metrics=Metrics(uri=str(b / "m")),
            decision=Markdown(uri=str(b / "out" / "d3")),
            publish_uri="s3://models/mnist",
            s3_endpoint="seaweedfs.kubeflow:9000",
        ),
        [],
        "d3",
        "s3_endpoint 'seaweedfs.kubeflow:9000' is not allowed; allowed: empty or http(s)://HOST[:PORT]",
    ),
    "deploy step name not a KServe name": lambda b, s: (
        _deploy(b, "dep1", serving_name="Mnist_V2"),
        [],
        "dep1",
        "serving_name 'Mnist_V2' is not allowed; allowed: empty, or lowercase letters, digits and '-'",
    ),
    "deploy step timeout zero": lambda b, s: (
        _deploy(b, "dep2", serving_timeout=0.0),
        [],
        "dep2",
        "serving_timeout 0.0 is not allowed; allowed: a number from 1 to 86400",
    ),
    "deploy step publish location inside the pod": lambda b, s: (
        _deploy(b, "dep3", publish_uri="/mnt/published"),
        [],
        "dep3",
        "publish_uri '/mnt/published' is not a location KServe's storage initializer can read; allowed: a URI",
    ),
}
