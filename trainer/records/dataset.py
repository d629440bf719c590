"""metadata.json, the prepared dataset's record: read, checked and written here, and nowhere else.

A prepared dataset is in one of two formats, told apart by the file's content:

- TFRecord shards of uint8 images (`trainer.data.tfrecords`, no `format` key, `format_version` 1): the image shape,
  the classes, and per split its example count and every shard with its SHA-256; with `location` (and `endpoint`,
  the S3 endpoint it was written through), the shards are there and not beside the file (`data_uri`);
- your function's splits saved by tf.data (`trainer.data.user_source`, `format` "tf.data"): the element spec as text,
  and per split its example count and directory.

Both read into one `DatasetMetadata`; `to_json` writes the same file back, so files written before it still read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from trainer.config import checks
from trainer.core.errors import UsageError

METADATA_FILE = "metadata.json"
IMAGES = "tfrecord"
SAVED = "tf.data"
FORMAT_VERSION = 1
SPLITS = ("train", "test")
# Where a dataset's shards may be (its `location`): a path, s3:// or gs://.
PLACES = checks.location("s3", "gs")


@dataclasses.dataclass(frozen=True)
class Shard:
    """One TFRecord file of a split: its plain file name, how many examples it holds, its SHA-256 hex digest."""

    file: str
    num_examples: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Split:
    """One split: its example count, and where its examples are (TFRecord `shards`, or a saved `directory`)."""

    num_examples: int
    shards: tuple[Shard, ...] = ()
    directory: str = ""

    def to_json(self) -> dict[str, Any]:
        """The split as metadata.json holds it."""
        if self.directory:
            return {"num_examples": self.num_examples, "directory": self.directory}
        return {"num_examples": self.num_examples, "shards": [dataclasses.asdict(s) for s in self.shards]}


@dataclasses.dataclass(frozen=True)
class DatasetMetadata:
    """A prepared dataset's metadata.json.

    Attributes:
        format: `tfrecord` (image shards) or `tf.data` (a function's saved splits).
        source: the source it was prepared from (`sample`, `tfds:mnist`, `idx:DIR`, `fn:package.module:function`).
        splits: the splits by name (`train`, `test`).
        created_by: the trainer version that wrote it.
        image_shape: height, width, channels of the images; None for saved splits.
        class_names: the classes in label order; empty for saved splits.
        element_spec: the saved splits' `(features, label)` spec as text; empty for images.
        location: where the shards are (`s3://`, `gs://`, a path on a claim); empty: beside metadata.json.
        endpoint: the S3 endpoint `location` was written through; empty: AWS S3 or `$AWS_ENDPOINT_URL_S3`.
    """

    format: str
    source: str | None
    splits: Mapping[str, Split]
    created_by: str = ""
    image_shape: tuple[int, int, int] | None = None
    class_names: tuple[str, ...] = ()
    element_spec: str = ""
    location: str = ""
    endpoint: str = ""

    FILE: ClassVar[str] = METADATA_FILE

    @property
    def num_classes(self) -> int:
        """How many classes the images have (0 for saved splits)."""
        return len(self.class_names)

    @classmethod
    def of_images(
        cls, source: str, image_shape: tuple[int, int, int], class_names: list[str], splits: Mapping[str, Split]
    ) -> DatasetMetadata:
        """The metadata of TFRecord image shards written by this trainer."""
        from trainer import __version__

        return cls(IMAGES, source, dict(splits), f"trainer {__version__}", tuple(image_shape), tuple(class_names))

    def placed(self, location: str, endpoint: str) -> DatasetMetadata:
        """This metadata with its shards at `location` (written through `endpoint`, on S3)."""
        return dataclasses.replace(self, location=location, endpoint=endpoint if location.startswith("s3://") else "")

    @classmethod
    def of_saved(cls, source: str, element_spec: str, splits: Mapping[str, Split]) -> DatasetMetadata:
        """The metadata of a function's splits saved by tf.data."""
        from trainer import __version__

        return cls(SAVED, source, dict(splits), f"trainer {__version__}", element_spec=element_spec)

    def split(self, split: str, directory: str) -> Split:
        """The split `split` of the dataset in `directory`.

        Raises:
            UsageError: the dataset has no such split, naming those it has.
        """
        if split not in self.splits:
            raise UsageError(f"dataset {directory!r} has no split {split!r}; it has {', '.join(self.splits)}")
        return self.splits[split]

    def num_examples(self, split: str) -> int:
        """The example count of `split` (which must exist)."""
        return self.splits[split].num_examples

    def to_json(self) -> dict[str, Any]:
        """The metadata as metadata.json holds it (the same keys as ever, per format)."""
        splits = {name: split.to_json() for name, split in self.splits.items()}
        if self.format == SAVED:
            return {
                "format": SAVED,
                "source": self.source,
                "element_spec": self.element_spec,
                "splits": splits,
                "created_by": self.created_by,
            }
        placed = {"location": self.location, **({"endpoint": self.endpoint} if self.endpoint else {})}
        return {
            "format_version": FORMAT_VERSION,
            "source": self.source,
            "image_shape": list(self.image_shape or ()),
            "num_classes": self.num_classes,
            "class_names": list(self.class_names),
            "splits": splits,
            "created_by": self.created_by,
            **(placed if self.location else {}),
        }

    def write(self, directory: str) -> None:
        """Writes metadata.json into `directory` (whole, or not at all)."""
        from trainer.core.files import write_json

        write_json(f"{directory.rstrip('/')}/{METADATA_FILE}", self.to_json())

    @classmethod
    def read(cls, directory: str) -> DatasetMetadata:
        """Reads and checks metadata.json of the prepared dataset in `directory`.

        Raises:
            UsageError: naming the directory when the metadata is missing, or the file and the first field that is
                missing or out of range, and what is allowed.
        """
        from trainer.core.files import exists, read_json

        path = f"{directory.rstrip('/')}/{METADATA_FILE}"
        if not exists(path):
            raise UsageError(
                f"dataset {directory!r} has no {METADATA_FILE}; prepare it with `trainer-prepare --output {directory}`"
            )
        try:
            data = read_json(path)
        except ValueError as err:
            raise UsageError(f"dataset metadata {path!r} is not valid JSON: {err}") from None
        return cls.from_json(data, path)

    @classmethod
    def from_json(cls, data: Any, path: str = METADATA_FILE) -> DatasetMetadata:
        """The metadata from metadata.json's content, checked field by field so nothing TensorFlow cannot take passes.

        Raises:
            UsageError: naming `path`, the first field that is missing or out of range, and what is allowed.
        """
        if not isinstance(data, dict):
            raise UsageError(f"dataset metadata {path!r} is not a JSON object")
        if data.get("format") == SAVED:
            return _saved(data, path)
        return _images(data, path)


def _fail(path: str, field: str, value: Any, allowed: str) -> UsageError:
    shown = repr(value) if len(repr(value)) <= 120 else repr(value)[:117] + "..."
    return UsageError(f"dataset metadata {path!r}: {field} {shown} is not allowed; allowed: {allowed}")


def _count(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _saved(data: dict[str, Any], path: str) -> DatasetMetadata:
    splits = data.get("splits")
    if not isinstance(splits, dict) or set(SPLITS) - set(splits):
        raise UsageError(f"dataset metadata {path!r}: splits {splits!r} is not allowed; allowed: train and test")
    checked = {}
    for split, info in splits.items():
        directory = info.get("directory") if isinstance(info, dict) else None
        count = info.get("num_examples") if isinstance(info, dict) else None
        if not isinstance(directory, str) or not directory or "/" in directory:
            raise UsageError(f"dataset metadata {path!r}: splits.{split}.directory {directory!r} is not a plain name")
        if not _count(count, 1):
            raise UsageError(f"dataset metadata {path!r}: splits.{split}.num_examples {count!r}; allowed: at least 1")
        checked[split] = Split(count, directory=directory)
    return DatasetMetadata(
        SAVED, data.get("source"), checked, str(data.get("created_by", "")), element_spec=str(data.get("element_spec"))
    )


def _images(data: dict[str, Any], path: str) -> DatasetMetadata:
    missing = [k for k in ("format_version", "image_shape", "num_classes", "class_names", "splits") if k not in data]
    if missing:
        raise UsageError(f"dataset metadata {path!r} lacks {', '.join(missing)}")
    if data["format_version"] != FORMAT_VERSION:
        raise _fail(path, "format_version", data["format_version"], str(FORMAT_VERSION))
    shape = data["image_shape"]
    if not (
        isinstance(shape, list)
        and len(shape) == 3
        and all(_count(d, 1) for d in shape)
        and shape[0] * shape[1] <= 4096**2
        and shape[2] in (1, 3, 4)
    ):
        raise _fail(
            path,
            "image_shape",
            shape,
            "[height, width, channels] with sides of at least 1 pixel, at most 16.7 M pixels, and 1, 3 or 4 channels",
        )
    classes = data["num_classes"]
    if not _count(classes, 2) or classes > 100_000:
        raise _fail(path, "num_classes", classes, "an integer from 2 to 100000")
    names = data["class_names"]
    if not (
        isinstance(names, list)
        and len(names) == classes
        and all(isinstance(n, str) and n for n in names)
        and len(set(names)) == len(names)
    ):
        raise _fail(path, "class_names", names, f"{classes} distinct non-empty names (num_classes)")
    splits = data["splits"]
    if not isinstance(splits, dict) or "train" not in splits:
        raise _fail(path, "splits", splits, "an object with a 'train' split (and 'test')")
    checked = {}
    for split, info in splits.items():
        shards = info.get("shards") if isinstance(info, dict) else None
        if (
            not isinstance(shards, list)
            or not shards
            or not all(
                isinstance(s, dict)
                and isinstance(s.get("file"), str)
                and "/" not in s["file"]
                and _count(s.get("num_examples"))
                and isinstance(s.get("sha256"), str)
                and len(s["sha256"]) == 64
                for s in shards
            )
        ):
            raise _fail(
                path,
                f"splits.{split}.shards",
                shards,
                "a list of {file, num_examples, sha256} with plain file names and SHA-256 hex digests",
            )
        total = info.get("num_examples")
        if not _count(total, 1) or total != sum(s["num_examples"] for s in shards):
            raise _fail(path, f"splits.{split}.num_examples", total, "at least 1, the sum of its shards' num_examples")
        checked[split] = Split(total, tuple(Shard(s["file"], s["num_examples"], s["sha256"]) for s in shards))
    location, endpoint = data.get("location", ""), data.get("endpoint", "")
    for field, value, check in (("location", location, PLACES), ("endpoint", endpoint, checks.s3_endpoint())):
        if not check.ok(value):
            raise _fail(path, field, value, check.allowed)
    return DatasetMetadata(
        IMAGES,
        data.get("source"),
        checked,
        str(data.get("created_by", "")),
        tuple(shape),
        tuple(names),
        location=location,
        endpoint=endpoint,
    )
