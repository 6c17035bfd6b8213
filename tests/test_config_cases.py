"""The config's validation, pinned case by case (tests/data/config_cases.json): for each file, the
effective config or the refusal (key and message) that pydantic gave when the config was built on it
(cases added since: what weightd gives, each reviewed when added).
The config now validates with ``weightd.config.model`` (pydantic's model building cost ~110 ms of
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


def test_types_and_bounds_as_pydantic_said() -> None:
    """A model with every kind of field and bound the config uses, against what pydantic (2.x, lax mode)
    answered for the same inputs, NaN and infinity included (tests/data/settings_model_cases.json)."""
    import math

    from weightd.config import model as sm

    class M(sm.BaseModel):
        a: float = sm.Field(default=1.0, gt=0)
        b: float = sm.Field(default=1.0, ge=0, le=10)
        c: int = sm.Field(default=1, ge=1)
        d: bool = False
        e: str = ""
        f: tuple[str, ...] = ()

    cases = json.loads((Path(__file__).parent / "data/settings_model_cases.json").read_text())
    for case in cases:
        given = {k: float(v) if isinstance(v, str) and v in ("nan", "inf") else v for k, v in case["input"].items()}
        try:
            got = {"ok": json.loads(json.dumps(M.model_validate(given).model_dump(), default=list))}
        except sm.SettingsError as exc:
            got = {"err": [exc.msg, list(exc.loc)]}
        want = {k: v for k, v in case.items() if k != "input"}
        if "ok" in want:
            want["ok"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in want["ok"].items()}
        assert got == want, (case, got)
    assert any(math.isnan(float(c["input"].get("a", 0))) for c in cases if c["input"].get("a") == "nan")
