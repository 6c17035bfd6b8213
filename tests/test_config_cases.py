"""The config's validation, pinned case by case: 124 files (40 accepted, 84 refused) with the effective
config or the refusal (key and message) that pydantic gave for each when the config was built on it.
The config now validates with ``weightd.settings_model`` (pydantic's model building cost ~110 ms of
every command's start); this keeps every value, coercion and message what it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weightd.config import config_to_dict, load_config
from weightd.errors import ConfigError

ENV = {"HOME": "/home/alice", "USER": "alice"}
CASES = json.loads((Path(__file__).parent / "data/config_cases.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["case"][:40] for c in CASES])
def test_config_case(tmp_path: Path, case: dict) -> None:
    f = tmp_path / "c.toml"
    f.write_text(case["case"] + "\n")
    if "err" in case:
        with pytest.raises(ConfigError) as info:
            load_config(f, env=ENV)
        assert [info.value.key, str(info.value).replace(str(f), "FILE")] == case["err"]
    else:
        assert json.loads(json.dumps(config_to_dict(load_config(f, env=ENV)), default=str)) == case["ok"]


def test_settings_are_frozen_and_compare_by_value(tmp_path: Path) -> None:
    a, b = load_config(None, env=ENV), load_config(None, env=ENV)
    assert a.settings == b.settings and a.settings.warm == b.settings.warm
    with pytest.raises(AttributeError):
        a.settings.warm.concurrency = 3   # type: ignore[misc]


def test_the_config_does_not_import_pydantic() -> None:
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import sys, weightd.config as c; c.load_config(None); "
                          "print('pydantic' in sys.modules)"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
