"""Where the repository and its shipped sample are."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DIR = ROOT / "data" / "mnist-sample"
