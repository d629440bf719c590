"""What a 2026 Kubeflow (KFP 2.16+) no longer has is named nowhere the project ships: MinIO's Service is gone."""

import subprocess

from tests.support.paths import ROOT

GONE = "minio" + "-service"  # KFP 2.16 removed it (kubeflow/pipelines#12613); the store is SeaweedFS


def test_no_shipped_default_help_text_or_doc_names_the_removed_minio_service():
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(files) > 100, "the walk sees the project"
    naming = []
    for name in files:
        path = ROOT / name
        if path.is_file() and path.suffix not in (".png", ".gz", ".idx", ".ubyte"):
            text = path.read_text(errors="replace")
            naming += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if GONE in line]
    assert naming == []
