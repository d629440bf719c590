"""The built image (`make image`) in a running Docker Engine: non-root, imports, and nothing of the build host inside.

Marked `image`: `make test` leaves these out; run them with `pytest -m image tests/test_image.py`. KFP_TF_IMAGE names
another image than kfp-tf-multiworker:<package version>.
"""

import base64
import json
import os
import re
import shutil
import ssl
import subprocess
import tarfile
from pathlib import Path

import pytest

import trainer

pytestmark = pytest.mark.image

IMAGE = os.environ.get("KFP_TF_IMAGE", f"kfp-tf-multiworker:{trainer.__version__}")
PUBLIC_DEBIAN_HOSTS = {"deb.debian.org", "security.debian.org", "ftp.debian.org", "snapshot.debian.org"}
HOST_BUNDLES = [
    "/etc/ssl/certs/ca-certificates.crt",
    *(os.environ.get(v) for v in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")),
]
PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s*(.*?)\s*-----END CERTIFICATE-----", re.DOTALL)


@pytest.fixture(scope="module")
def docker():
    """The docker CLI, once the engine answers and holds the image."""
    cli = shutil.which("docker")
    if not cli or subprocess.run([cli, "info"], capture_output=True, timeout=60).returncode != 0:
        pytest.fail("no Docker Engine answers `docker info` (python3 deploy/image.py engine starts one as root)")
    if subprocess.run([cli, "image", "inspect", IMAGE], capture_output=True, timeout=60).returncode != 0:
        pytest.fail(f"the engine has no image {IMAGE}: build it with `make image`")
    return cli


def _run(docker, *command):
    result = subprocess.run([docker, "run", "--rm", IMAGE, *command], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def mirror_hosts():
    """Package-mirror hosts in this machine's apt sources, public Debian hosts left out (the image names those)."""
    paths = [
        Path("/etc/apt/sources.list"),
        *sorted(Path("/etc/apt/sources.list.d").glob("*.sources")),
        *sorted(Path("/etc/apt/sources.list.d").glob("*.list")),
    ]
    text = "\n".join(p.read_text(errors="replace") for p in paths if p.is_file())
    hosts = {m.lower() for m in re.findall(r"\b[a-z][a-z0-9+.-]*://([^/\s:\]]+)", text)}
    return sorted(hosts - PUBLIC_DEBIAN_HOSTS)


def _certificates(text: bytes):
    return {ssl.PEM_cert_to_DER_cert(m.group(0).decode()): m.group(1) for m in PEM.finditer(text)}


def stock_certificates():
    """DER bytes of Debian's stock CA set (/usr/share/ca-certificates/mozilla), else of Mozilla's set in certifi.

    Debian's set comes first: a certifi can be patched to hold a local CA (the host's pyenv one here holds the egress
    CA).
    """
    stock = set()
    for path in Path("/usr/share/ca-certificates/mozilla").glob("*.crt"):
        stock.update(_certificates(path.read_bytes()))
    if not stock:
        import certifi

        stock.update(_certificates(Path(certifi.where()).read_bytes()))
    return stock


def host_only_certificates():
    """(DER, PEM body) of each certificate in the host's CA bundles that is not a stock one: the egress CA and the "
    "like."""
    found = {}
    for bundle in filter(None, HOST_BUNDLES):
        if Path(bundle).is_file():
            found.update(_certificates(Path(bundle).read_bytes()))
    stock = stock_certificates()
    return [(der, body) for der, body in found.items() if der not in stock]


def needles():
    """Byte strings that must appear nowhere in the image, with what each stands for."""
    found = {host.encode(): f"apt mirror host #{n}" for n, host in enumerate(mirror_hosts())}
    for n, (der, body) in enumerate(host_only_certificates()):
        found[der] = f"host-only CA #{n} (DER)"
        found[body] = f"host-only CA #{n} (PEM)"
        found[base64.b64encode(der)] = f"host-only CA #{n} (base64, one line)"
    return found


def scan_export(docker, wanted, chunk=1 << 24):
    """Streams `docker export` of a container of the image; returns (findings, files read, bytes read)."""
    overlap = max(len(n) for n in wanted) - 1
    findings, files, total = [], 0, 0
    container = subprocess.run([docker, "create", IMAGE], capture_output=True, text=True, check=True).stdout.strip()
    try:
        export = subprocess.Popen([docker, "export", container], stdout=subprocess.PIPE)
        with tarfile.open(fileobj=export.stdout, mode="r|") as tar:
            for member in tar:
                name = member.name.lstrip("./")
                if Path(name).name in ("pip.conf", "pip.ini"):
                    findings.append(f"{name}: a pip configuration file")
                for needle, what in wanted.items():
                    if needle.lower() in name.lower().encode():
                        findings.append(f"{name}: {what} in the file name")
                if not member.isfile():
                    continue
                files += 1
                data, carry = tar.extractfile(member), b""
                while block := data.read(chunk):
                    total += len(block)
                    window = carry + block
                    findings += [f"{name}: {what}" for needle, what in wanted.items() if needle in window]
                    carry = window[-overlap:]
        assert export.wait() == 0
    finally:
        subprocess.run([docker, "rm", container], capture_output=True)
    return sorted(set(findings)), files, total


def test_runs_as_uid_and_gid_1000(docker):
    assert _run(docker, "id", "-u") == "1000"
    assert _run(docker, "id", "-g") == "1000"


def test_what_the_steps_import_imports_as_that_user_and_only_that_is_installed(docker):
    imports = "tensorflow, tf_keras, tensorflow_datasets, pyarrow, kfp, kubernetes, s3fs, gcsfs, pygal, tensorboard"
    out = _run(docker, "python", "-c", f"import os, {imports}, trainer; print(os.getuid(), trainer.__version__)")
    assert out.splitlines()[-1] == f"1000 {trainer.__version__}"
    installed = {line.split("==")[0].lower().replace("_", "-") for line in _run(docker, "pip", "freeze").splitlines()}
    assert {"tensorflow-cpu", "tf-keras"} <= installed
    assert not {"tensorflow", "kfp-kubernetes", "matplotlib"} & installed, (
        "the GPU-capable build and compile-time tools"
    )


def test_the_image_is_at_most_1_5_gb_and_its_layers_are_reported(docker, capsys):
    size = int(
        subprocess.run(
            [docker, "image", "inspect", "--format", "{{.Size}}", IMAGE], capture_output=True, text=True, check=True
        ).stdout
    )
    layers = subprocess.run(
        [docker, "history", "--format", "{{.Size}}\t{{.CreatedBy}}", IMAGE], capture_output=True, text=True, check=True
    ).stdout
    with capsys.disabled():
        print(f"\nimage {IMAGE}: {size / 1e9:.2f} GB ({size} bytes); layers, newest first:")
        for line in layers.splitlines():
            layer_size, _, created_by = line.partition("\t")
            print(f"  {layer_size:>8}  {' '.join(created_by.split())[:100]}")
    assert size <= 1.5e9, f"{size / 1e9:.2f} GB"


def test_a_worker_starts_in_the_container_and_forms_its_cluster(docker, capsys):
    """Two workers started together in one container: from process start to "cluster formed", without a peer wait."""
    script = (
        "import json, re, subprocess, sys, time\n"
        "from trainer.cluster.local_processes import free_ports\n"
        "subprocess.run(['trainer-prepare', '--source', 'sample', '--output', '/tmp/data', '--max-train-examples', "
        "'512', '--max-test-examples', '128'], check=True, capture_output=True)\n"
        "ports = free_ports(2)\n"
        "cluster = {'worker': [f'localhost:{p}' for p in ports]}\n"
        "started = time.monotonic()\n"
        "procs = [subprocess.Popen(['trainer-train', '--data', '/tmp/data', '--model-dir', f'/tmp/model{i}', "
        "'--epochs', '1'], env={'PATH': '/usr/local/bin:/usr/bin:/bin', 'HOME': '/tmp', 'TF_CPP_MIN_LOG_LEVEL': '2', "
        "'TF_CONFIG': json.dumps({'cluster': cluster, 'task': {'type': 'worker', 'index': i}})}, "
        "stderr=subprocess.PIPE, text=True) for i in range(2)]\n"
        "formed = []\n"
        "for proc in procs:\n"
        "    for line in proc.stderr:\n"
        "        if 'cluster formed' in line:\n"
        "            formed.append(round(time.monotonic() - started, 1))\n"
        "            break\n"
        "print(json.dumps({'formed': formed, 'codes': [p.wait(timeout=600) for p in procs]}))\n"
    )
    result = json.loads(_run(docker, "python", "-c", script).splitlines()[-1])
    assert result["codes"] == [0, 0] and len(result["formed"]) == 2, result
    with capsys.disabled():
        print(
            f"\nworker start in the container, process start to cluster formed: {max(result['formed']):.1f}s "
            f"(workers {result['formed']})"
        )


def test_environment_has_no_pip_or_tls_settings_of_the_build_host(docker):
    config = json.loads(
        subprocess.run([docker, "image", "inspect", IMAGE], capture_output=True, text=True, check=True).stdout
    )[0]
    env = dict(item.split("=", 1) for item in config["Config"]["Env"])
    pip_env = {k: v for k, v in env.items() if k.startswith("PIP_")}
    assert set(pip_env) <= {"PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK"}, pip_env
    assert not any(re.search(r"cert|\.crt|\.pem|pip\.conf", v, re.IGNORECASE) for v in env.values()), env
    assert not {"REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "CURL_CA_BUNDLE"} & set(env)


def test_history_names_neither_the_mirror_nor_a_pip_conf(docker):
    history = subprocess.run(
        [docker, "history", "--no-trunc", "--format", "{{.CreatedBy}} {{.Comment}}", IMAGE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "pip install" in history
    assert "pip.conf" not in history
    for n, host in enumerate(mirror_hosts()):
        assert host not in history.lower(), f"apt mirror host #{n} is in the image history"


@pytest.mark.timeout(1200)
def test_filesystem_holds_no_pip_config_host_ca_or_mirror(docker):
    control = f'__version__ = "{trainer.__version__}"'.encode()
    wanted = {**needles(), control: "control"}
    findings, files, total = scan_export(docker, wanted)
    assert any(f.endswith(": control") for f in findings), "the scan did not read the trainer package: it reads nothing"
    assert [f for f in findings if not f.endswith(": control")] == []
    assert files > 10_000 and total > 500_000_000, (files, total)
