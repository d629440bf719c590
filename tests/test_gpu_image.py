"""The GPU image (`make image-gpu`): its pins, and, built, that it imports TensorFlow and trains on CPU without a GPU.

The pin tests run with the suite. The ones marked `gpu_image` need a Docker Engine holding both images and run only
through `make image-gpu-check` (`make test` and `make e2e` deselect them): KFP_TF_GPU_IMAGE and KFP_TF_IMAGE name
other images than kfp-tf-multiworker:<package version>-gpu and kfp-tf-multiworker:<package version>.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import trainer
from tests.support.paths import ROOT

GPU_IMAGE = os.environ.get("KFP_TF_GPU_IMAGE", f"kfp-tf-multiworker:{trainer.__version__}-gpu")
CPU_IMAGE = os.environ.get("KFP_TF_IMAGE", f"kfp-tf-multiworker:{trainer.__version__}")
REQUIREMENTS = ROOT / "requirements"
# Two runs of the same seeded training on the same CPU differ only in the order floating-point sums are taken in;
# the two TensorFlow builds run the same CPU kernels.
ACCURACY_TOLERANCE = 0.02


def _pins(path):
    """Requirement name (lowercase, dashes, extras kept) to version."""
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.strip().split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_gpu_requirements_are_the_cpu_ones_with_tensorflow_and_cuda_and_every_nvidia_wheel_pinned():
    cpu, gpu = _pins(REQUIREMENTS / "image.txt"), _pins(REQUIREMENTS / "gpu" / "image.txt")
    nvidia = {name: version for name, version in gpu.items() if name.startswith("nvidia-")}
    assert gpu.pop("tensorflow[and-cuda]") == cpu.pop("tensorflow-cpu"), "the same TensorFlow, with CUDA"
    assert {name: version for name, version in gpu.items() if name not in nvidia} == cpu
    assert len(nvidia) >= 10 and all(re.fullmatch(r"[\d.]+", version) for version in nvidia.values()), nvidia
    assert _pins(REQUIREMENTS / "gpu" / "image-no-deps.txt") == _pins(REQUIREMENTS / "image-no-deps.txt")


def test_the_gpu_image_tests_run_only_through_their_own_target():
    makefile = (ROOT / "Makefile").read_text()
    selections = [quoted or bare for quoted, bare in re.findall(r'-m (?:"([^"]+)"|(\S+))', makefile)]
    assert [s for s in selections if "gpu_image" in s and "not gpu_image" not in s] == ["gpu_image"]
    for selection in selections:
        assert "gpu_image" in selection or "not" not in selection, f"-m {selection!r} would run the GPU image tests"
    target = re.search(r"^image-gpu-check:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert "REQUIREMENTS=requirements/gpu" in target and "tests/test_gpu_image.py" in target
    addopts = re.search(r"^addopts = (.*)$", (ROOT / "setup.cfg").read_text(), re.MULTILINE).group(1)
    assert "not gpu_image" in addopts


def test_the_ci_build_passes_the_gpu_build_argument_to_docker_build():
    sys.path.insert(0, str(ROOT / ".ci" / "containers"))
    try:
        import build
        import engine
    finally:
        sys.path.remove(str(ROOT / ".ci" / "containers"))
    argv = build.build_command(
        engine.Engine("docker", "/var/lib/docker"),
        ["docker", "build"],
        [],
        "kfp-tf-multiworker:0.1.0-gpu",
        "python:3.11.7-slim-bookworm",
        build_args=(build.check_build_arg("REQUIREMENTS=requirements/gpu"),),
    )
    assert argv[argv.index("--tag") - 4 : argv.index("--tag")] == [
        "--build-arg",
        "BASE=python:3.11.7-slim-bookworm",
        "--build-arg",
        "REQUIREMENTS=requirements/gpu",
    ]
    assert (ROOT / "requirements" / "gpu" / "image.txt").is_file(), "the folder REQUIREMENTS names"


@pytest.mark.parametrize("build_arg", ["BASE=python:3.12", "REQUIREMENTS", "=requirements/gpu", "1X=y"])
def test_a_bad_build_argument_is_one_error_line_and_exit_2(build_arg):
    result = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "containers" / "build.py"), "build", "--build-arg", build_arg],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: --build-arg {build_arg!r} is not NAME=VALUE: allowed is a NAME of letters, digits and _ other than "
        "BASE (--base sets that), such as REQUIREMENTS=requirements/gpu"
    ]


@pytest.fixture(scope="module")
def docker():
    """The docker CLI, once the engine answers and holds both images."""
    cli = shutil.which("docker")
    if not cli or subprocess.run([cli, "info"], capture_output=True, timeout=60).returncode != 0:
        pytest.fail("no Docker Engine answers `docker info` (.ci/containers/build.py engine starts one as root)")
    for image in (GPU_IMAGE, CPU_IMAGE):
        if subprocess.run([cli, "image", "inspect", image], capture_output=True, timeout=60).returncode != 0:
            pytest.fail(f"the engine has no image {image}: build both with `make image-gpu-check`")
    return cli


def _run(docker, image, script, timeout=600):
    """Runs `python -c script` in a container of `image`; returns its stdout's last line, parsed as JSON."""
    result = subprocess.run(
        [docker, "run", "--rm", image, "python", "-c", script], capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _size(docker, image):
    return int(
        subprocess.run(
            [docker, "image", "inspect", "--format", "{{.Size}}", image], capture_output=True, text=True, check=True
        ).stdout
    )


@pytest.mark.gpu_image
def test_tensorflow_with_cuda_imports_lists_no_gpu_here_and_every_nvidia_library_loads(docker, capsys):
    script = (
        "import ctypes, glob, json, os, sys, tensorflow as tf, nvidia\n"
        "info = tf.sysconfig.get_build_info()\n"
        "libs = sorted(p for d in nvidia.__path__ for p in glob.glob(os.path.join(d, '*', 'lib', 'lib*.so*')))\n"
        "failed = {}\n"
        "for path in libs:\n"
        "    try:\n"
        "        ctypes.CDLL(path)\n"
        "    except OSError as err:\n"
        "        failed[os.path.basename(path)] = str(err)\n"
        "headers = glob.glob(os.path.join(nvidia.__path__[0], '*', 'include'))\n"
        "print(json.dumps({'version': tf.__version__, 'cuda': tf.test.is_built_with_cuda(),\n"
        "    'cuda_version': info.get('cuda_version'), 'cudnn_version': info.get('cudnn_version'),\n"
        "    'gpus': [d.name for d in tf.config.list_physical_devices('GPU')],\n"
        "    'cpus': [d.name for d in tf.config.list_physical_devices('CPU')],\n"
        "    'libs': len(libs), 'failed': failed, 'headers': headers, 'uid': os.getuid()}))\n"
    )
    found = _run(docker, GPU_IMAGE, script)
    assert found["version"] == "2.21.0" and found["cuda"], found
    assert found["gpus"] == [] and found["cpus"], "this machine has no GPU: TensorFlow must list none and keep the CPU"
    # The driver's libcuda.so.1 comes from the node (the NVIDIA container toolkit mounts it); the rest is the image's.
    needs_driver = {name for name, error in found["failed"].items() if error.startswith("libcuda.so.1: cannot open")}
    assert found["failed"].keys() == needs_driver, found["failed"]
    assert found["libs"] >= 12 and len(needs_driver) <= 2, found
    assert found["headers"] == [] and found["uid"] == 1000
    with capsys.disabled():
        print(
            f"\n{GPU_IMAGE}: TensorFlow {found['version']} built with CUDA {found['cuda_version']}, cuDNN "
            f"{found['cudnn_version']}; {found['libs'] - len(needs_driver)} of {found['libs']} NVIDIA libraries load, "
            f"{sorted(needs_driver)} only with the node's driver (libcuda.so.1); GPUs here: none, so it runs on "
            f"{found['cpus']}"
        )


@pytest.mark.gpu_image
def test_installed_is_what_the_gpu_requirements_pin(docker):
    freeze = subprocess.run(
        [docker, "run", "--rm", GPU_IMAGE, "pip", "freeze"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    installed = {
        name.lower().replace("_", "-"): version
        for name, _, version in (line.partition("==") for line in freeze.splitlines())
    }
    pinned = _pins(REQUIREMENTS / "gpu" / "image.txt")
    assert installed["tensorflow"] == pinned.pop("tensorflow[and-cuda]")
    assert "tensorflow-cpu" not in installed and "kfp-kubernetes" not in installed
    assert {name: installed.get(name) for name in pinned} == pinned
    assert {name for name in installed if name.startswith("nvidia-")} == {n for n in pinned if n.startswith("nvidia-")}


@pytest.mark.gpu_image
@pytest.mark.timeout(1800)
def test_the_sample_trains_on_cpu_in_the_gpu_image_to_the_cpu_images_accuracy(docker, capsys):
    """The same seeded run (prepare the sample, train 2 epochs, evaluate) in both images."""
    steps = [
        "trainer-prepare --source sample --output /tmp/data",
        "trainer-train --data /tmp/data --model-dir /tmp/model --epochs 2 --seed 7 --batch-size 64",
        "trainer-evaluate --model-dir /tmp/model --data /tmp/data --output /tmp/metrics.json",
    ]
    script = (
        "import json, subprocess, time\n"
        "started = time.monotonic()\n"
        f"for step in {[shlex.split(s) for s in steps]!r}:\n"
        "    subprocess.run(step, check=True, capture_output=True)\n"
        "metrics = json.load(open('/tmp/metrics.json'))\n"
        "print(json.dumps({'accuracy': metrics['accuracy'], 'seconds': round(time.monotonic() - started, 1)}))\n"
    )
    cpu, gpu = _run(docker, CPU_IMAGE, script), _run(docker, GPU_IMAGE, script)
    with capsys.disabled():
        print(
            f"\nsample, 2 epochs, seed 7, test accuracy: {CPU_IMAGE} {cpu['accuracy']:.4f} ({cpu['seconds']} s, "
            f"{_size(docker, CPU_IMAGE) / 1e9:.2f} GB); {GPU_IMAGE} on CPU {gpu['accuracy']:.4f} "
            f"({gpu['seconds']} s, {_size(docker, GPU_IMAGE) / 1e9:.2f} GB)"
        )
    assert cpu["accuracy"] > 0.5, "the CPU image's run learned nothing: the comparison would prove nothing"
    assert abs(gpu["accuracy"] - cpu["accuracy"]) <= ACCURACY_TOLERANCE, (cpu, gpu)
