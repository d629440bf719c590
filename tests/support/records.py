"""Files the trainer writes, written here for tests that hand them to a later step."""


def write_history(directory, run_id: str = "run-1") -> None:
    """A chief's history.json as the trainer writes it, for tests that hand a model directory to a later step."""
    from trainer.records.history import History

    History(
        epochs=({"epoch": 1, "loss": 0.5, "accuracy": 0.9, "examples_per_second": 1000.0},),
        workers=2,
        strategy="multi_worker_mirrored",
        global_batch_size=128,
        steps_per_epoch=31,
        learning_rate=0.0028,
        dataset="sample",
        class_names=tuple("0123456789"),
        image_shape=(28, 28, 1),
        run_id=run_id,
        tensorboard="",
        parameters={"epochs": 1},
    ).write(str(directory))
