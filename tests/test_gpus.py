"""GPUs: pods that ask for them (the compiled YAML), workers that use them (device, all-reduce and precision choice,
with the GPU list faked at TensorFlow's config boundary only), and the launcher's CUDA_VISIBLE_DEVICES per worker.

Nothing here has a GPU: what stays unproven without one is in docs/gpus.md.
"""

import json
import logging
import sys
from pathlib import Path

import pytest
import yaml

from pipelines import tfjob as tfjob_cli
from pipelines.pods import PodSettings, gpu_tag
from tests.support.paths import ROOT
from tests.support.pipelines import IMAGE, run_cli
from trainer import launch
from trainer.cluster import local_processes
from trainer.core.cpus import input_threads
from trainer.core.errors import UsageError

GPU_IMAGE = IMAGE + "-gpu"
TRAINING = {
    "multi_worker_mirrored": {"exec-train-worker"},
    "parameter_server": {"exec-train-chief", "exec-train-server"},
}


def _documents(path):
    spec, platform = list(yaml.safe_load_all(Path(path).read_text()))
    return spec["deploymentSpec"]["executors"], platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


@pytest.mark.parametrize("strategy", list(TRAINING))
def test_both_strategies_compile_training_tasks_that_ask_for_gpus_in_the_gpu_image(tmp_path, capsys, strategy):
    out = tmp_path / "p.yaml"
    result = run_cli(
        capsys,
        "--compile",
        "--image",
        IMAGE,
        "--strategy",
        strategy,
        "--gpus",
        "2",
        "--accelerator",
        "nvidia.com/gpu",
        "--gpu-node-selector",
        "cloud.google.com/gke-accelerator=nvidia-tesla-t4",
        "--gpu-tolerations",
        "nvidia.com/gpu:NoSchedule,pool=gpu",
        "--output",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert f"training image {GPU_IMAGE} with 2 nvidia.com/gpu" in result.stdout
    executors, platform = _documents(out)
    training = TRAINING[strategy]
    assert training <= set(executors)
    for name, executor in executors.items():
        container = executor["container"]
        if name in training:
            assert container["image"] == GPU_IMAGE
            assert container["resources"]["accelerator"] == {
                "count": "2",
                "resourceCount": "2",
                "resourceType": "nvidia.com/gpu",
                "type": "nvidia.com/gpu",
            }
            assert platform[name]["nodeSelector"] == {"labels": {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}}
            assert platform[name]["tolerations"] == [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "pool", "operator": "Equal", "value": "gpu"},
            ]
        else:
            assert container["image"] == IMAGE, name
            assert "accelerator" not in container.get("resources", {}), name
            assert "nodeSelector" not in platform.get(name, {}) and "tolerations" not in platform.get(name, {}), name


def test_amd_gpus_in_an_image_of_your_own_and_no_pool_settings(tmp_path, capsys):
    own = "registry.example.com/team/rocm-trainer:1"
    out = tmp_path / "p.yaml"
    result = run_cli(
        capsys, "--compile", "--image", IMAGE, "--gpus", "1", "--accelerator", "amd.com/gpu",
        "--gpu-image", own, "--output", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    executors, platform = _documents(out)
    worker = executors["exec-train-worker"]["container"]
    assert worker["image"] == own and worker["resources"]["accelerator"]["resourceType"] == "amd.com/gpu"
    assert worker["resources"]["accelerator"]["resourceCount"] == "1"
    assert "nodeSelector" not in platform["exec-train-worker"] and "tolerations" not in platform["exec-train-worker"]


def test_without_gpus_nothing_asks_for_them(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert run_cli(capsys, "--compile", "--image", IMAGE, "--output", str(out)).returncode == 0
    executors, _ = _documents(out)
    assert {e["container"]["image"] for e in executors.values()} == {IMAGE}
    assert all("accelerator" not in e["container"].get("resources", {}) for e in executors.values())


def test_a_tfjob_asking_for_one_nvidia_gpu_compiles_to_tasks_that_ask_for_it(tmp_path, capsys):
    out = tmp_path / "job.yaml"
    manifest = ROOT / "tests" / "tfjob_corpus" / "04-gke-gpu-pool.yaml"
    code = tfjob_cli.main([str(manifest), "--compile", "--image", IMAGE, "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    executors, platform = _documents(out)
    asking = {
        name: executor["container"]["resources"]["accelerator"]
        for name, executor in executors.items()
        if "accelerator" in executor["container"].get("resources", {})
    }
    assert asking and all(a["resourceType"] == "nvidia.com/gpu" and a["resourceCount"] == "1" for a in asking.values())
    for name in asking:
        assert platform[name]["nodeSelector"]["labels"]["cloud.google.com/gke-accelerator"] == "nvidia-tesla-t4"
        assert any(t["key"] == "nvidia.com/gpu" for t in platform[name]["tolerations"])
    # the manifest's GPU replicas run their own image, this project's steps the CPU one
    assert all(e["container"]["image"] == IMAGE for n, e in executors.items() if n not in asking)


@pytest.mark.parametrize(
    ("image", "gpu"),
    [
        (
            "registry.example.com/team/kfp-tf-multiworker:0.1.0",
            "registry.example.com/team/kfp-tf-multiworker:0.1.0-gpu",
        ),
        ("localhost:5000/kfp-tf-multiworker", "localhost:5000/kfp-tf-multiworker:latest-gpu"),
        ("kfp-tf-multiworker:dev", "kfp-tf-multiworker:dev-gpu"),
    ],
)
def test_the_gpu_image_is_the_tag_beside_the_image(image, gpu):
    assert gpu_tag(image) == gpu
    assert PodSettings(gpus=1).training_image(image) == gpu
    assert PodSettings().training_image(image) == image


def test_pool_settings_parse_to_what_kubernetes_takes():
    pods = PodSettings(gpus=1, gpu_node_selector="a=b, c.io/d=e", gpu_tolerations="k=v:NoExecute,nvidia.com/gpu")
    assert pods.node_selector() == (("a", "b"), ("c.io/d", "e"))
    assert pods.tolerations() == (
        {"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute"},
        {"key": "nvidia.com/gpu", "operator": "Exists"},
    )


def _pipeline(*argv):
    from pipelines import cli

    return cli.main, ["--compile", "--image", IMAGE, *argv]


BAD = {
    "count not an integer": (*_pipeline("--gpus", "1.5"), "argument --gpus: invalid int value: '1.5'"),
    "count negative": (*_pipeline("--gpus=-2"), "gpus -2 is not allowed; allowed: a whole number from 0 to 16"),
    "unknown accelerator": (
        *_pipeline("--gpus", "1", "--accelerator", "intel.com/gpu"),
        "accelerator 'intel.com/gpu' is not allowed; allowed: nvidia.com/gpu, amd.com/gpu",
    ),
    "pool settings without GPUs": (
        *_pipeline("--gpu-node-selector", "a=b"),
        "gpu_node_selector 'a=b' is not allowed with gpus 0; allowed: gpus 1 or more",
    ),
    "toleration effect unknown": (
        *_pipeline("--gpus", "1", "--gpu-tolerations", "nvidia.com/gpu:Never"),
        "gpu_tolerations 'nvidia.com/gpu:Never' is not allowed; allowed: KEY[=VALUE][:EFFECT]",
    ),
    "GPU tag of a digest": (
        *_pipeline("--gpus", "1", "--image", "registry.example.com/t/i@sha256:" + "a" * 64),
        "is pinned by a digest, so no GPU tag can be derived from it",
    ),
    "launcher GPUs per worker negative": (
        launch.main,
        ["--workers", "2", "--gpus-per-worker=-1"],
        "gpus_per_worker -1 is not allowed; allowed: 0 or more",
    ),
    "launcher GPUs per worker not an integer": (
        launch.main,
        ["--workers", "2", "--gpus-per-worker", "two"],
        "argument --gpus-per-worker: invalid int value: 'two'",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_gpu_input_is_one_error_line_exit_2_and_nothing_written(case, tmp_path, capsys, monkeypatch):
    entry, argv, message = BAD[case]
    monkeypatch.chdir(tmp_path)
    code = entry([*argv, "--output", str(tmp_path / "p.yaml")] if entry is not launch.main else argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and message in errors[0], err
    assert list(tmp_path.iterdir()) == []


def test_more_gpus_per_worker_than_the_launcher_sees_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(local_processes.GPU_ENV, "0,1,2")
    monkeypatch.chdir(tmp_path)
    code = launch.main(["--workers", "2", "--gpus-per-worker", "2", "--", "--data", "x", "--model-dir", "m"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and errors == [
        "error: gpus_per_worker 2 is not allowed: 2 workers x 2 GPUs is more than the 3 GPUs this launcher can see "
        "(CUDA_VISIBLE_DEVICES='0,1,2'); allowed: at most 1"
    ]
    assert list(tmp_path.iterdir()) == []


def test_the_gpus_the_launcher_sees(tmp_path):
    none = str(tmp_path / "absent")
    assert local_processes.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == (["2", "3"], "CUDA_VISIBLE_DEVICES='2,3'")
    assert local_processes.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,-1,1"})[0] == ["0"]
    assert local_processes.visible_gpus({"CUDA_VISIBLE_DEVICES": ""})[0] == []
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA T4 (UUID: GPU-a)'\necho 'GPU 1: NVIDIA T4 (UUID: GPU-b)'\n")
    smi.chmod(0o755)
    assert local_processes.visible_gpus({}, smi=(str(smi), "-L"), proc=none) == (["0", "1"], "nvidia-smi -L")
    proc = tmp_path / "gpus"
    for bus in ("0000:00:04.0", "0000:00:05.0", "0000:00:06.0"):
        (proc / bus).mkdir(parents=True)
    assert local_processes.visible_gpus({}, smi=(none,), proc=str(proc)) == (["0", "1", "2"], str(proc))
    assert local_processes.visible_gpus({}, smi=(none,), proc=none)[0] == []


def test_each_worker_gets_gpus_of_its_own_and_the_others_none():
    assign = local_processes.gpu_assignments
    assert assign(["worker", "worker"], 2, ["0", "1", "2", "3"]) == ["0,1", "2,3"]
    assert assign(["chief", "ps", "worker", "worker"], 1, ["4", "5", "6"]) == ["", "", "4", "5"]
    assert assign(["worker"] * 3, 0, []) is None


def test_launched_workers_see_disjoint_cuda_visible_devices(tmp_path, capsys):
    cluster, _ = local_processes.local_topology(3, 0)
    report = "import json, os, sys; print('GPUS ' + json.dumps([json.loads(os.environ['TF_CONFIG'])['task']['index'], os.environ['CUDA_VISIBLE_DEVICES']]))"  # noqa: E501
    gpus = local_processes.gpu_assignments(["worker"] * 3, 2, ["0", "1", "2", "3", "4", "5"])
    group = local_processes.WorkerGroup([sys.executable, "-c", report], cluster, grace=5, gpus=gpus, pin=False)
    group.start()
    assert group.wait() == (0, None)
    seen = dict(
        json.loads(line.split("GPUS ", 1)[1]) for line in capsys.readouterr().out.splitlines() if "GPUS " in line
    )
    assert seen == {0: "0,1", 1: "2,3", 2: "4,5"}


def test_gpu_pods_keep_host_threads_for_their_gpus():
    assert input_threads(8, 0) == 8
    assert input_threads(8, 2) == 4
    assert input_threads(3, 4) == 1


def _gpus(count):
    """What `tf.config.list_physical_devices("GPU")` returns on a pod with `count` GPUs (TensorFlow's own type)."""
    import tensorflow as tf

    return [tf.config.PhysicalDevice(name=f"/physical_device:GPU:{i}", device_type="GPU") for i in range(count)]


def test_workers_with_gpus_all_reduce_with_nccl_and_cpu_workers_with_ring():
    import tensorflow as tf

    from trainer.training.collectives import Devices, choose_devices, communication_options

    two = choose_devices(_gpus(2))
    assert two == Devices(("/physical_device:GPU:0", "/physical_device:GPU:1"), "NCCL")
    assert two.replicas == 2
    assert two.describe() == "2 GPUs (/physical_device:GPU:0, /physical_device:GPU:1), NCCL all-reduce"
    cpu = choose_devices(tf.config.list_physical_devices("GPU"))  # none here
    assert cpu == Devices((), "RING") and cpu.replicas == 1 and cpu.describe() == "CPU, RING all-reduce"
    implementation = tf.distribute.experimental.CommunicationImplementation
    assert communication_options(two, 0, 0).implementation == implementation.NCCL
    options = communication_options(cpu, 4096, 30.0)
    assert (options.implementation, options.bytes_per_pack, options.timeout_seconds) == (implementation.RING, 4096, 30)


def test_mixed_precision_needs_gpus():
    from trainer.training.collectives import choose_devices, precision_policy

    assert precision_policy("mixed_float16", choose_devices(_gpus(1))) == "mixed_float16"
    assert precision_policy("", choose_devices(_gpus(1))) == "float32"
    assert precision_policy("", choose_devices([])) == "float32"
    with pytest.raises(UsageError, match=r"^mixed_precision 'mixed_float16' is not allowed on a worker without GPUs"):
        precision_policy("mixed_float16", choose_devices([]))


@pytest.fixture
def float32_after():
    yield
    import tf_keras as keras

    keras.mixed_precision.set_global_policy("float32")


def _config(data_dir, model_dir, **model):
    from trainer.config.contract import DataConfig, ModelConfig, OptimConfig, RuntimeConfig, TrainConfig

    return TrainConfig(
        RuntimeConfig(data_dir=data_dir, model_dir=str(model_dir), run_id="gpus"),
        data=DataConfig(shuffle_buffer=64),
        model=ModelConfig(**model),
        optim=OptimConfig(epochs=1, batch_size=8, steps_per_epoch=2, steps_per_execution=1),
    )


def test_mixed_precision_on_a_worker_without_gpus_is_refused_before_anything_is_written(sample_data, tmp_path):
    from trainer.training import mirrored

    with pytest.raises(UsageError, match="mixed_precision 'mixed_float16' is not allowed on a worker without GPUs"):
        mirrored.run(_config(sample_data, tmp_path / "model", mixed_precision="mixed_float16"), None)
    assert list(tmp_path.iterdir()) == []


def test_a_worker_with_gpus_builds_the_cnn_under_mixed_precision_and_scales_per_replica(
    sample_data, tmp_path, monkeypatch, caplog, float32_after
):
    """The GPU list is faked at TensorFlow's config boundary; the model then trains on this CPU."""
    import tensorflow as tf
    import tf_keras as keras

    from trainer.training import mirrored

    listed = tf.config.list_physical_devices

    def faked(device_type=None):
        return _gpus(2) if device_type == "GPU" else listed(device_type)

    monkeypatch.setattr(tf.config, "list_physical_devices", faked)
    caplog.set_level(logging.INFO, logger="trainer.training.mirrored")
    config = _config(sample_data, tmp_path / "model", mixed_precision="mixed_float16")
    history = mirrored.run(config, None, strategy=tf.distribute.MirroredStrategy(["/cpu:0"]))
    assert history.global_batch_size == 16
    text = caplog.text
    assert (
        "devices: 2 GPUs (/physical_device:GPU:0, /physical_device:GPU:1), NCCL all-reduce; precision mixed_float16"
        in text
    )  # noqa: E501
    assert "global batch 16 (8 per replica x 2 replicas: 1 workers x 2 GPUs each)" in text
    assert "learning rate 0.002 per replica x sqrt(2 replicas) = 0.00282843" in text
    model = keras.models.load_model(tmp_path / "model" / "model.keras", compile=False)
    policies = {layer.name: layer.dtype_policy.name for layer in model.layers if layer.weights}
    assert policies.pop("probabilities") == "float32", "the softmax stays float32 for numerical stability"
    assert set(policies.values()) == {"mixed_float16"}, policies


def test_the_parameter_server_strategy_refuses_mixed_precision(sample_data, tmp_path):
    from trainer.training import parameter_server

    config = _config(sample_data, tmp_path / "model", mixed_precision="mixed_float16")
    with pytest.raises(UsageError, match="mixed_precision 'mixed_float16' is not allowed with the parameter_server"):
        parameter_server.check_topology(None, config)


def test_mixed_precision_is_a_flag_of_trainer_train_and_a_parameter_of_the_mirrored_pipeline(tmp_path, capsys):
    from trainer import train

    args = train.build_parser().parse_args(["--data", "d", "--model-dir", "m", "--mixed-precision", "mixed_float16"])
    assert args.mixed_precision == "mixed_float16"
    out = tmp_path / "p.yaml"
    assert run_cli(capsys, "--compile", "--image", IMAGE, "--output", str(out)).returncode == 0
    spec = next(yaml.safe_load_all(out.read_text()))
    assert spec["root"]["inputDefinitions"]["parameters"]["mixed_precision"] == {
        "defaultValue": "",
        "description": spec["root"]["inputDefinitions"]["parameters"]["mixed_precision"]["description"],
        "isOptional": True,
        "parameterType": "STRING",
    }
    workers = spec["root"]["dag"]["tasks"]["for-loop-1"]["componentRef"]["name"]
    worker = spec["components"][workers]["dag"]["tasks"]["train-worker"]["inputs"]["parameters"]["mixed_precision"]
    assert worker == {"componentInputParameter": "pipelinechannel--mixed_precision"}
