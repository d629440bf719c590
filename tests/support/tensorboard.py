"""TensorBoard event files read back with TensorBoard's own reader (EventAccumulator)."""

from pathlib import Path

TRAIN_TAGS = {"loss", "accuracy", "learning_rate", "examples_per_second"}


def read_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of one TensorBoard run directory, as TensorBoard's scalar plugin would load it."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    accumulator = event_accumulator.EventAccumulator(str(directory), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    scalars = {}
    for tag in accumulator.Tags()["tensors"]:
        assert accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars", tag
        scalars[tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in accumulator.Tensors(tag)]
    return scalars
