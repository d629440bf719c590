"""The configuration contract: one declaration per setting, and everything else derived from it."""

import dataclasses
import math
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from components import signatures
from pipelines.factories import FACTORIES
from tests.support.paths import ROOT
from tests.support.pipelines import IMAGE, pipeline_spec
from trainer.config import contract as config
from trainer.config import settings
from trainer.config.flags import flag_name
from trainer.core.errors import UsageError


def test_every_setting_is_declared_once_with_help_and_a_check():
    names = [f.name for f in settings.fields()]
    assert len(names) == len(set(names)), "a setting name belongs to one group"
    for f in settings.fields():
        assert len(f.metadata["help"]) > 15 and isinstance(f.metadata["check"], config.Check), f.name
        if f.default is not dataclasses.MISSING:
            assert f.metadata["check"].ok(f.default), f"{f.name}'s own default passes its check"


def test_overrides_name_settings_say_why_and_pass_the_check():
    for name, override in signatures.PIPELINE_OVERRIDES.items():
        assert override.value != settings.default(name) and len(override.reason) > 40
        assert settings.check(name, override.value) == override.value


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("epochs", 0, "an integer from 1 to 100000"),
        ("epochs", 2.5, "an integer from 1 to 100000"),
        ("epochs", True, "an integer from 1 to 100000"),
        ("learning_rate", math.nan, "a number from 1e-09 to 10"),
        ("learning_rate", math.inf, "a number from 1e-09 to 10"),
        ("startup_timeout", -math.inf, "a number from 1 to 86400"),
        ("min_accuracy", 1.5, "a number from 0 to 1"),
        ("cluster_mode", "docker", "kubernetes, local"),
        ("source", "ftp://x", "'sample', 'idx:DIR_OR_URI'"),
        ("port", 65535, "an integer from 1 to 65534"),
    ],
)
def test_a_bad_value_is_named_with_what_is_allowed(name, value, allowed):
    with pytest.raises(
        UsageError, match=rf"^{name} {value!r} is not allowed; allowed: ".replace("(", r"\(").replace(")", r"\)")
    ) as err:
        settings.check(name, value)
    assert allowed in str(err.value)


def test_ints_are_accepted_where_numbers_are_declared():
    assert config.ClusterConfig(startup_timeout=30).startup_timeout == 30.0
    assert config.TrainConfig(config.RuntimeConfig("d", "m")).replace(epochs=3, seed=7).optim.epochs == 3


def test_a_training_config_takes_its_own_settings_by_name_and_refuses_the_others():
    built = config.TrainConfig.from_settings(data_dir="d", model_dir="m", epochs=3, storage="kfp", port=2300)
    assert (built.optim.epochs, built.storage.storage, built.cluster.port, built.runtime.data_dir) == (
        3,
        "kfp",
        2300,
        "d",
    )
    assert built.replace(s3_endpoint="http://s3:9000").storage.s3_endpoint == "http://s3:9000"
    for name in ("serving_name", "serving_timeout", "no_such_setting"):
        message = rf"^'{name}' is not a setting of a training task; allowed: the settings of the groups runtime, data"
        with pytest.raises(UsageError, match=message):
            built.replace(**{name: 1})
        with pytest.raises(UsageError, match=message):
            config.TrainConfig.from_settings(data_dir="d", model_dir="m", **{name: 1})
    with pytest.raises(UsageError, match="^a training task needs model_dir$"):
        config.TrainConfig.from_settings(data_dir="d")


def test_the_training_step_refuses_a_setting_it_would_not_use(tmp_path):
    from trainer import steps

    with pytest.raises(UsageError, match="'serving_name' is not a setting of a training task"):
        steps.train_task(str(tmp_path), str(tmp_path), "worker", 0, str(tmp_path / "m"), "run-1", serving_name="m")


@pytest.fixture(params=list(FACTORIES))
def compiled(request, compiled_yaml):
    return pipeline_spec(compiled_yaml[request.param])


def test_every_default_and_description_in_the_yaml_comes_from_the_contract(compiled):
    root = compiled["root"]["inputDefinitions"]["parameters"]
    assert root, "the pipeline has parameters"
    for name, parameter in root.items():
        assert parameter["defaultValue"] == signatures.pipeline_default(name), name
        assert parameter["description"] == settings.help_text(name), name
    component_defaults = 0
    for component in compiled["components"].values():
        for name, parameter in component.get("inputDefinitions", {}).get("parameters", {}).items():
            if "defaultValue" in parameter and not name.startswith("pipelinechannel--"):
                assert parameter["defaultValue"] == signatures.pipeline_default(name), name
                assert parameter["description"] == settings.help_text(name), name
                component_defaults += 1
    assert component_defaults >= 20


def test_the_cli_help_shows_the_contracts_defaults():
    from trainer import prepare, train

    for parser, names in (
        (train.build_parser(), [n for g in train.SETTINGS.values() for n in g]),
        (prepare.build_parser(), prepare.SETTINGS),
    ):
        text = " ".join(parser.format_help().split())
        for name in names:
            f = settings.field(name)
            assert flag_name(f) in text, name
            if f.default is not dataclasses.MISSING and not isinstance(f.default, bool):
                shown = repr(f.default) if isinstance(f.default, str) else str(f.default)
                assert f"{' '.join(f.metadata['help'].split())} (default: {shown})" in text, name


def test_a_default_changed_once_shows_up_in_the_cli_the_components_and_the_yaml(tmp_path):
    """Edit one default in a copy of the code, then read the CLI help, a component's default and the compiled YAML."""
    for package in ("trainer", "components", "pipelines"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    source = (tmp_path / "trainer" / "config" / "contract.py").read_text()
    declaration = 'epochs: int = setting(12, "passes over the training data"'
    assert declaration in source
    (tmp_path / "trainer" / "config" / "contract.py").write_text(
        source.replace(declaration, declaration.replace("(12,", "(7,"))
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    script = (
        "import components, yaml, sys; from pipelines.cli import compile_pipeline; "
        f"compile_pipeline('{tmp_path}/p.yaml', '{IMAGE}'); "
        "print(components.build('x').train_worker.component_spec.inputs['epochs'].default)"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["7"]
    spec = next(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))
    assert spec["root"]["inputDefinitions"]["parameters"]["epochs"]["defaultValue"] == 7
    assert spec["components"]["comp-train-worker"]["inputDefinitions"]["parameters"]["epochs"]["defaultValue"] == 7
    help_text = subprocess.run(
        [sys.executable, "-m", "trainer.train", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True
    ).stdout
    assert "passes over the training data (default: 7)" in " ".join(help_text.split())
